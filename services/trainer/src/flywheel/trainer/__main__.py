"""``python -m flywheel.trainer [serve|migrate|check-config]``."""

from flywheel.trainer.app import main

main()
