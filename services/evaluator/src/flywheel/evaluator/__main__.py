"""``python -m flywheel.evaluator [serve|check-config]``."""

from flywheel.evaluator.app import main

main()
