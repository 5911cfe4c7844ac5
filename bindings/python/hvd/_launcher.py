"""The `hvdrun` console script of a pip-installed hvd: runs the launcher shipped in hvd/bin."""

import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "hvdrun")
    if not os.access(exe, os.X_OK):
        sys.stderr.write("hvdrun: the launcher is not installed at %s; build it with CMake "
                         "(target hvdrun) and run build/bin/hvdrun\n" % exe)
        return 127
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
