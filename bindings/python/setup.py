"""pip install for the hvd Python package (hvd, hvd.numpy, hvd.torch).

    /usr/bin/python3 -m pip install --no-build-isolation --no-deps --break-system-packages bindings/python

Builds with the project's CMake (no network, no build isolation needed): configures the
repository two levels up (or $HVD_SOURCE_DIR) in this package's build_temp with the tests off,
builds the extension hvd._core, libhvd and the launcher hvdrun, and installs the extension with
libhvd.so.0 next to it (found through the RPATH $ORIGIN), and the launcher as hvd/bin/hvdrun
behind a console script `hvdrun`.
Extra CMake arguments may be given in $HVD_CMAKE_ARGS (e.g. "-DHVD_WITH_MPI=OFF").
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.environ.get("HVD_SOURCE_DIR", os.path.join(HERE, "..", "..")))


def project_version():
    try:
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            m = re.search(r"project\(hvd\s+VERSION\s+([0-9.]+)", f.read())
        return m.group(1) if m else "0.0.0"
    except OSError:
        return "0.0.0"


class CMakeBuild(build_ext):
    """Builds hvd._core (and libhvd, hvdrun) with the repository's CMake."""

    def run(self):
        if not os.path.exists(os.path.join(ROOT, "core", "include", "hvd", "engine.h")):
            raise RuntimeError("hvd sources not found at %s; set HVD_SOURCE_DIR to the "
                               "repository root" % ROOT)
        for tool in ("cmake",):
            if shutil.which(tool) is None:
                raise RuntimeError("%s is needed to build hvd (apt install cmake)" % tool)
        super().run()

    def build_extension(self, ext):
        build_dir = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build_dir,
                     "-DCMAKE_BUILD_TYPE=Release",
                     "-DHVD_BUILD_TESTS=OFF",
                     "-DHVD_BUILD_PYTHON=ON",
                     "-DHVD_PYTHON_RPATH_ORIGIN_ONLY=ON",
                     "-DPython3_EXECUTABLE=" + sys.executable]
        configure += shlex.split(os.environ.get("HVD_CMAKE_ARGS", ""))
        jobs = os.environ.get("HVD_BUILD_JOBS", str(min(os.cpu_count() or 1, 8)))
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs,
                               "--target", "hvd_python_core", "hvdrun"])

        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        package_build = os.path.join(build_dir, "python", "hvd")
        built = [f for f in os.listdir(package_build) if f.startswith("_core") and f.endswith(".so")]
        if len(built) != 1:
            raise RuntimeError("expected one _core*.so in %s, found %s" % (package_build, built))
        shutil.copyfile(os.path.join(package_build, built[0]), target)
        lib = os.path.realpath(os.path.join(build_dir, "lib", "libhvd.so.0"))
        shutil.copyfile(lib, os.path.join(os.path.dirname(target), "libhvd.so.0"))
        # The launcher rides along as package data; the console script hvdrun execs it.
        bin_dir = os.path.join(os.path.dirname(target), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        shutil.copy2(os.path.join(build_dir, "bin", "hvdrun"), os.path.join(bin_dir, "hvdrun"))


setup(
    name="hvd",
    version=project_version(),
    description="Horovod-style collectives for NumPy and PyTorch (import hvd.torch as hvd)",
    packages=["hvd", "hvd.common", "hvd.torch", "hvd.torch.elastic"],
    ext_modules=[Extension("hvd._core", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    entry_points={"console_scripts": ["hvdrun = hvd._launcher:main"]},
    python_requires=">=3.8",
    zip_safe=False,
)
