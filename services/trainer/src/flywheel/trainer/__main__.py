"""``python -m flywheel.trainer [serve|check-config]``."""

from flywheel.trainer.app import main

main()
