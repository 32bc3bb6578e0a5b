// main() for GPU test binaries: runs the tests, and exits with ctest's skip
// code (77) when every test that ran was skipped for lack of a GPU, so a
// machine without one reports "skipped", not "passed".
#include <gtest/gtest.h>

#include "test_skip.h"

int main(int argc, char **argv) {
    testing::InitGoogleTest(&argc, argv);
    const int result = RUN_ALL_TESTS();
    const testing::UnitTest &unit = *testing::UnitTest::GetInstance();
    if (result == 0 && unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count()) {
        return flashcore_test::kSkipExitCode;
    }
    return result;
}
