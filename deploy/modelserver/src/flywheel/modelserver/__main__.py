"""``python -m flywheel.modelserver --port 8000 [--adapter name=path]``."""

from flywheel.modelserver.cli import main

main()
