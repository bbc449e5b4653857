// The scheduler's test-only fault (plan.cpp, host code in its own unit): the active fault lives
// in testonly/api.cpp's unit, which answers through this one entry.
#pragma once
#include <stdint.h>

extern "C" __attribute__((visibility("hidden"))) int kernels_testonly_ws_without_lse(void);
// workspace_without_lse: a partial row sized as its output alone.
#define HOOK_WS_ROW_FLOATS(dvo) ((int64_t)(dvo) + (kernels_testonly_ws_without_lse() ? 0 : 1))
