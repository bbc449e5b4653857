// Compiled only into the coverage build (kernels/build.py --coverage). Harness processes
// leave by os._exit, which skips libgcov's exit-time writer: they call kernels_coverage_flush
// first (kernels/_lib.py flush_coverage). A dump then a reset, so a later dump (another
// flush, or the exit-time writer of a process that does exit normally) adds only what ran
// since. A forked child calls kernels_coverage_reset: what it inherited is its parent's to
// write, once.
extern "C" void __gcov_dump(void);
extern "C" void __gcov_reset(void);

extern "C" void kernels_coverage_flush(void) {
  __gcov_dump();
  __gcov_reset();
}

extern "C" void kernels_coverage_reset(void) { __gcov_reset(); }
