from harness.cli import main
from harness.engine.fast_exit import exit_now

# Every command's files are closed by the time main returns (harness/engine/fast_exit.py).
exit_now(main())
