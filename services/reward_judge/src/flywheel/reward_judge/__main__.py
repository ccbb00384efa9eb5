"""``python -m flywheel.reward_judge [serve|migrate|check-config]``."""

from flywheel.reward_judge.app import main

main()
