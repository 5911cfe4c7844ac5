// HVD_SANITIZED: defined where the tests are built with AddressSanitizer or ThreadSanitizer
// (scripts/sanitize.sh), whose slowdown and own memory void the checks of time and resident size.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HVD_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HVD_SANITIZED 1
#endif
#endif
