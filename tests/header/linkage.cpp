// Compiled with -fsyntax-only by the header.linkage.cxx test: the header
// must give its functions C linkage in C++. Redeclaring a function with
// extern "C" after the header declared it with C++ linkage is an error, so
// this file stops compiling if the extern "C" block goes missing.
#include "flashcore.h"
#include "flashcore_test_api.h"

#define FLASHCORE_REDECLARE_C(ret, name, params) extern "C" ret flashcore_##name params;
FLASHCORE_TEST_API(FLASHCORE_REDECLARE_C)
