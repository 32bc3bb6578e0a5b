/* A program linked against the installed libflashcore, built by the
 * consumer.pkgconfig test (compile line from pkg-config) and by
 * cmake_project/ (flashcore::flashcore). */
#include <flashcore.h>

#include "consumer_checks.h"

int main(void)
{
    const flashcore_test_api api = {FLASHCORE_TEST_API(FLASHCORE_TEST_API_LINKED)};
    return consumer_run_checks(&api, "linked") == 0 ? 0 : 1;
}
