"""A script that ends while daemon threads wait in hvd calls (a metrics thread, a prefetcher):
the rank must exit 0. Four threads wait in allreduces no other rank matches; the main thread
ends without hvd.shutdown(). At interpreter exit Python ends a daemon thread that takes the GIL
back with pthread_exit; where hvd took the GIL back in a destructor, that was std::terminate
(the rank died with SIGABRT, a finished job exited 134)."""

import threading
import time

import numpy as np

import hvd.numpy as hvd

hvd.init()
r = hvd.rank()


def blocked(i):
    try:
        hvd.allreduce(np.ones(4, dtype=np.float32), name="unmatched.%d.%d" % (r, i))
    except hvd.HvdError:
        pass  # the shutdown at exit fails it


for i in range(4):
    threading.Thread(target=blocked, args=(i,), daemon=True).start()
time.sleep(0.3)
print("DAEMON-EXIT rank %d ends" % r, flush=True)
