// Whether this test binary was built with a sanitizer (`make check`). Their allocators hold
// freed memory in quarantine and shadow memory grows with use, so bounds on resident memory
// do not apply there; everything else a test checks still does.
#pragma once

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
