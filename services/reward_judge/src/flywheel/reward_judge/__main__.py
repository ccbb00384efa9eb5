"""``python -m flywheel.reward_judge [serve|check-config]``."""

from flywheel.reward_judge.app import main

main()
