#pragma once
// The thread-local message behind a non-zero status (kernels_last_error).
int kernels_fail(const char* fmt, ...);
