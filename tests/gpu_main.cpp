// main() for GPU test binaries: runs the tests, and exits with ctest's skip
// code (77) when every test that ran was skipped for lack of a GPU, so a
// machine without one reports "skipped", not "passed".
//
// With FLASHCORE_SKIP_LOG set (ctest sets it, see tests/CMakeLists.txt), each
// skipped test appends its reason as one line to that file; after the run
// ctest prints how many were skipped for each reason (skip_summary.sh).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "test_skip.h"

namespace {

// The reason a skipped test gave: the last line of its skip message, without
// FC_REQUIRE_GPU's "GPU test skipped: " in front.
std::string skip_reason(const testing::TestResult &result) {
    for (int i = 0; i < result.total_part_count(); ++i) {
        const testing::TestPartResult &part = result.GetTestPartResult(i);
        if (!part.skipped()) continue;
        std::string message = part.message();
        while (!message.empty() && message.back() == '\n') message.pop_back();
        message = message.substr(message.rfind('\n') + 1);  // npos + 1 == 0: the whole message
        const std::string prefix = "GPU test skipped: ";
        if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
        if (!message.empty()) return message;
    }
    return "no reason given";
}

// One line per skipped test, each appended with a single write (O_APPEND), so
// tests running in parallel do not mix their lines.
void log_skips(const testing::UnitTest &unit) {
    const char *path = std::getenv("FLASHCORE_SKIP_LOG");
    if (path == nullptr || *path == '\0') return;
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    for (int s = 0; s < unit.total_test_suite_count(); ++s) {
        const testing::TestSuite &suite = *unit.GetTestSuite(s);
        for (int t = 0; t < suite.total_test_count(); ++t) {
            const testing::TestInfo &info = *suite.GetTestInfo(t);
            if (!info.should_run() || !info.result()->Skipped()) continue;
            const std::string line = skip_reason(*info.result()) + "\n";
            if (write(fd, line.data(), line.size()) < 0) break;
        }
    }
    close(fd);
}

}  // namespace

int main(int argc, char **argv) {
    testing::InitGoogleTest(&argc, argv);
    const int result = RUN_ALL_TESTS();
    const testing::UnitTest &unit = *testing::UnitTest::GetInstance();
    log_skips(unit);
    if (result == 0 && unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count()) {
        return flashcore_test::kSkipExitCode;
    }
    return result;
}
