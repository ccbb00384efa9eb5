"""``python -m flywheel.optimizer [serve|migrate|check-config]``."""

from flywheel.optimizer.app import main

main()
