"""``python -m flywheel.trace_store [serve|migrate|check-config]``."""

from flywheel.trace_store.app import main

main()
