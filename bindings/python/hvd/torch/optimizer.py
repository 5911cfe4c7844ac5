"""DistributedOptimizer: averages gradients over ranks while backward is still running.

For every parameter that requires a gradient, a hook on its gradient accumulator (the autograd
node that writes p.grad) enqueues p.grad's allreduce the moment autograd has produced it, so
communication overlaps the rest of backward. step() (or synchronize()) waits for all of them,
writes the averaged gradients back into p.grad and then runs the wrapped optimizer's step.

With op=hvd.Adasum it is Horovod's delta optimizer: when a parameter's gradient is ready, the
wrapped optimizer steps that parameter alone, on this rank's gradient, and the change it made is
what the ranks combine with Adasum; step() then sets every parameter to its value before the
local step plus the combined change.

Sparse gradients (nn.Embedding(sparse=True)) are allgathered as Horovod does
(sparse_allreduce_async), or with sparse_as_dense=True made dense and allreduced.

With backward_passes_per_step = k, gradients accumulate locally for k backward passes and the
allreduce is enqueued on the k-th. Parameters that got no gradient in a step are allreduced in
synchronize() (with zero gradients) so every rank submits the same names.

Thread-safety: like the torch optimizer it wraps, one per training loop.
"""

import contextlib
import warnings

import torch

from hvd import _core, _process_set_id, global_process_set
from hvd.torch.compression import Compression
from hvd.torch.mpi_ops import allreduce_async_, sparse_allreduce_async, synchronize


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=_core.AVERAGE, gradient_predivide_factor=1.0, process_set=None,
                 sparse_as_dense=False):
        super(self.__class__, self).__init__(params)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set if process_set is not None else global_process_set
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        if gradient_predivide_factor != 1.0 and op != _core.AVERAGE:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average")
        self._adasum_starts = {}  # op=Adasum: each parameter's value before its local step

        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            names = [n for n, _ in named_parameters]
            if len(set(names)) != len(names):
                dups = sorted({n for n in names if names.count(n) > 1})
                raise ValueError("named_parameters has duplicate names: %s" % ", ".join(dups))
            self._parameter_names = {p: n for n, p in named_parameters}
            missing = [p for p in all_params if p not in self._parameter_names]
            if missing:
                raise ValueError("named_parameters lacks %d of the optimizer's parameters"
                                 % len(missing))
        else:
            self._parameter_names = {p: "noname.%d" % i for i, p in enumerate(all_params)}

        self._handles = {}        # parameter -> (handle or None, compression ctx)
        self._grad_accs = []      # keeps the accumulator nodes (and so the hooks) alive
        self._allreduce_delay = {}
        self._requires_update = set()
        self._ordered = []        # the parameters that require grad, in param_groups order
        self._synchronized = False
        self._should_synchronize = True
        # Ranks outside the process set step on their own gradients, as in Horovod. As there, an
        # elastic job communicates even in a world of one rank: the world may grow.
        self._communicates = self.process_set.included() and (
            self.process_set.size() > 1 or _core.elastic())
        if self._communicates:
            self._register_hooks()

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                self._ordered.append(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                # expand_as gives a view whose grad_fn's first input is p's accumulator.
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*_):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "gradients were computed more than backward_passes_per_step times "
                        "before step(); raise backward_passes_per_step to accumulate locally")
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if self.op == _core.ADASUM:
            return self._adasum_delta_async(p)
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                handle = sparse_allreduce_async(p.grad, name=self._parameter_names[p],
                                                op=self.op, process_set=self.process_set)
                return handle, None
            p.grad = p.grad.to_dense()
        prescale, postscale = 1.0, 1.0
        if self.op == _core.AVERAGE:
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        compressed, ctx = self._compression.compress(p.grad)
        handle = allreduce_async_(compressed, name=self._parameter_names[p], op=self.op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return handle, ctx

    def _adasum_delta_async(self, p):
        """Steps p alone on this rank's gradient and enqueues the Adasum of the change."""
        start = self._adasum_starts.get(p)
        if start is None:
            start = self._adasum_starts[p] = torch.empty_like(p.data)
        start.copy_(p.data)
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)  # p holds this rank's change until step()
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._parameter_names[p], op=_core.ADASUM,
                                  process_set=self.process_set)
        return handle, ctx

    def _adasum_step(self, closure):
        loss = closure() if closure is not None else None
        for p in self._ordered:
            if p not in self._handles or self._handles[p][0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for p, (handle, ctx) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), ctx)
                start = self._adasum_starts[p]
                start.add_(delta)
                p.data.copy_(start)
                self._allreduce_delay[p] = self.backward_passes_per_step
        finally:
            self._handles.clear()
        return loss

    def synchronize(self):
        """Waits for every gradient's allreduce (enqueueing those not yet started). With
        op=hvd.Adasum there is nothing to wait for here: step() combines the changes."""
        if self.op == _core.ADASUM and self._communicates:
            return
        if not self._communicates:
            self._synchronized = True
            return
        for p in self._ordered:
            if p not in self._handles or self._handles[p][0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for p, (handle, ctx) in self._handles.items():
                output = synchronize(handle)
                self._allreduce_delay[p] = self.backward_passes_per_step
                if output.is_sparse:
                    p.grad = output.coalesce()
                    continue
                result = self._compression.decompress(output, ctx)
                if result is not p.grad:
                    p.grad.copy_(result)
        finally:
            self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize() yourself first,
        e.g. to clip the averaged gradients)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self.op == _core.ADASUM and self._communicates:
            return self._adasum_step(closure)
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's words: scripts and tests look for them.
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=_core.AVERAGE,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None):
    """Wraps a torch optimizer so that step() uses gradients averaged (op) over the ranks of
    process_set (all of them by default).

    Arguments as horovod.torch.DistributedOptimizer: named_parameters (names the allreduces;
    otherwise positions are used), compression (Compression.none / fp16),
    backward_passes_per_step (local accumulation), op (Average, Sum, Adasum, ...),
    gradient_predivide_factor (divide by f before the sum and multiply by f/size after).
    sparse_as_dense: sparse gradients are made dense and allreduced (else allgathered as
    sparse). num_groups and groups are accepted for compatibility (in horovod.torch's order of
    arguments): the engine fuses ready gradients on its own.
    """
    _process_set_id(process_set)
    if num_groups or groups is not None:
        which = "groups" if groups is not None else "num_groups"
        warnings.warn("DistributedOptimizer(%s=...) is ignored: the engine fuses gradients "
                      "that are ready together" % which)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, process_set, sparse_as_dense)
