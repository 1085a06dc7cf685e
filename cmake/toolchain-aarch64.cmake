# Cross build for aarch64 (ARM64) Linux with Debian's toolchain and multiarch packages
# (g++-aarch64-linux-gnu; the target's libraries as <package>:arm64 in /usr/lib/aarch64-linux-gnu,
# beside the build machine's, so there is no sysroot). ctest runs the test binaries under
# qemu-user. scripts/check-aarch64.sh installs all of it, builds build-aarch64 and runs the suites:
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake -DLOOM_WITH_MPI=OFF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The programs run on the target's runtime libraries from multiarch packages (libc6:arm64,
# libstdc++6:arm64, libgomp1:arm64: /lib/ld-linux-aarch64.so.1 and /usr/lib/aarch64-linux-gnu),
# the versions the -dev packages were built with. Not `-L /usr/aarch64-linux-gnu`: that loader
# (libc6-arm64-cross) is older than the multiarch libc it then loads, and the mix hangs at the
# first thread a program starts.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
# Programs (ccache, pkg-config) are the build machine's; libraries and headers are searched in the
# usual places, where CMAKE_LIBRARY_ARCHITECTURE picks the aarch64 ones.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (FindOpenSSL asks it first) reads the target's .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
