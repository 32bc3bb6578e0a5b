// Tests of environment variables that handles read when created
// (src/handle.cpp): set them for a scope, and check what creation refuses.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "flashcore.h"

// Sets environment variables for its lifetime (handles read them when
// created), restoring what was there before.
class ScopedEnv {
   public:
    ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars) {
        for (const auto &[name, value] : vars) {
            const char *previous = std::getenv(name);
            saved_.push_back({name, previous != nullptr, previous == nullptr ? "" : previous});
            setenv(name, value, 1);
        }
    }
    ~ScopedEnv() {
        for (const Saved &s : saved_) {
            if (s.was_set) {
                setenv(s.name, s.value.c_str(), 1);
            } else {
                unsetenv(s.name);
            }
        }
    }

   private:
    struct Saved {
        const char *name;
        bool was_set;
        std::string value;
    };
    std::vector<Saved> saved_;
};

// flashcore_create with environment variable `name` set to `value`,
// restoring the variable afterwards; *message: the last error message after
// the call.
inline flashcore_status create_with_env(const char *name, const char *value, flashcore_handle *h, std::string *message) {
    const ScopedEnv env({{name, value}});
    const flashcore_status status = flashcore_create(h);
    *message = flashcore_last_error_message();
    return status;
}

// Each value of the environment variable `name` makes handle creation fail
// with a message that quotes it; `valid` is accepted.
inline void expect_env_values_rejected(const char *name, std::initializer_list<const char *> values, const char *valid) {
    for (const char *value : values) {
        flashcore_handle h = nullptr;
        std::string message;
        EXPECT_EQ(create_with_env(name, value, &h, &message), FLASHCORE_STATUS_INVALID_ARGUMENT) << value;
        EXPECT_EQ(h, nullptr);
        EXPECT_NE(message.find(std::string(name) + " is '" + value + "'"), std::string::npos) << message;
        if (h != nullptr) flashcore_destroy(h);
    }
    flashcore_handle h = nullptr;
    std::string message;
    EXPECT_EQ(create_with_env(name, valid, &h, &message), FLASHCORE_STATUS_SUCCESS) << message;
    if (h != nullptr) flashcore_destroy(h);
}

