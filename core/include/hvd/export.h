// Symbol visibility: the library is built with -fvisibility=hidden; the public API is marked.
#pragma once

#if defined(HVD_BUILDING_LIBRARY)
#define HVD_EXPORT __attribute__((visibility("default")))
#else
#define HVD_EXPORT
#endif
