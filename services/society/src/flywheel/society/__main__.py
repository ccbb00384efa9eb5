"""``python -m flywheel.society [serve|check-config]``."""

from flywheel.society.app import main

main()
