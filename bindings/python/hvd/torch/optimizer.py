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

groups (Horovod's): a number N splits the parameters, in rank 0's order, into N runs of about
equal length; a list of lists of parameters names the groups (the others stay alone). A group's
gradients go out together as one grouped allreduce once the last of them is ready, and are
fused and negotiated as one.

Thread-safety: like the torch optimizer it wraps, one per training loop.
"""

import contextlib
import numbers
import warnings

import torch

from hvd import _core, _process_set_id, global_process_set
from hvd.torch.compression import Compression
from hvd.torch.functions import broadcast_object
from hvd.torch.mpi_ops import (allreduce_async_, grouped_allreduce_async_,
                               sparse_allreduce_async, synchronize)


def _passes(n):
    """backward_passes_per_step: a whole number of passes, at least 1 (anything else ran as 1
    without a word)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError("backward_passes_per_step must be an integer of at least 1, got %r"
                         % (n,))
    return int(n)


class _Group(tuple):
    """A group's parameters, a dictionary key by identity: hashing a plain tuple goes over
    every member, and the hook of each gradient looks its group up, which made a step cost the
    number of parameters squared over the number of groups (10,000 parameters in one group: 28
    s a step, against 1 s alone)."""
    __slots__ = ()
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=_core.AVERAGE, gradient_predivide_factor=1.0, process_set=None,
                 sparse_as_dense=False, groups=None):
        super(self.__class__, self).__init__(params)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set if process_set is not None else global_process_set
        self._compression = compression
        self.backward_passes_per_step = _passes(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        if gradient_predivide_factor != 1.0 and op != _core.AVERAGE:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average")
        self._adasum_starts = {}  # op=Adasum: each parameter's value before its local step
        # sparse_as_dense: the parameters whose sparse gradient went out dense this step; their
        # reduced gradient is made sparse again, as Horovod does (SparseAdam takes no other).
        self._densified = set()

        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(np_, tuple) or len(np_) != 2 for np_ in named_parameters):
                raise ValueError("named_parameters should be a sequence of tuples (name, "
                                 "parameter), usually produced by model.named_parameters()")
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
            # Horovod's names for them. Given names get the op as prefix, so these go out as
            # "allreduce.allreduce.noname.<i>", apart from the caller's own unnamed
            # allreduces ("allreduce.noname.<n>", _ops.op_name), which a step may interleave.
            self._parameter_names = {p: "allreduce.noname.%d" % i
                                     for i, p in enumerate(all_params)}

        # parameter, or a group's tuple of parameters -> (handle or None, compression ctx)
        self._handles = {}
        self._group_of = {}       # parameter -> its group (a tuple), for grouped parameters
        self._group_ready = {}    # group -> its parameters whose gradient is ready
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
            if groups and op != _core.ADASUM:  # Horovod's Adasum optimizer takes no groups
                self._form_groups(groups)

    def load_state_dict(self, *args, **kwargs):
        """As Horovod's: also forgets what this step had accumulated or sent (a rollback, as in
        an elastic reset, starts the next step afresh)."""
        self._reset_step()
        self._synchronized = False
        self._should_synchronize = True
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    def set_backward_passes_per_step(self, passes):
        """Horovod's: from now on, gradients accumulate locally for ``passes`` backward passes
        before they go out (the current count starts again)."""
        self.backward_passes_per_step = passes = _passes(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _reset_step(self):
        self._handles.clear()
        self._group_ready.clear()
        self._densified.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _form_groups(self, groups):
        """Horovod's groups: a count splits the parameters, in the order of the set's first
        rank, into that many runs of near-equal length (the first runs one longer); lists name
        the groups, and the parameters in none stay alone."""
        params = list(self._ordered)
        if isinstance(groups, int):
            names = [self._parameter_names[p] for p in params]
            root = _core.process_set_ranks(_process_set_id(self.process_set))[0]
            order = broadcast_object(names, root_rank=root, name="DistributedOptimizer.groups",
                                     process_set=self.process_set)
            if sorted(order) != sorted(names):
                raise ValueError("DistributedOptimizer(groups=%d): rank %d's parameters differ "
                                 "from rank %d's: %s against %s"
                                 % (groups, _core.rank(), root, names, order))
            at = {n: i for i, n in enumerate(order)}
            params.sort(key=lambda p: at[self._parameter_names[p]])
            base, extra = divmod(len(params), groups)
            formed, start = [], 0
            for i in range(groups):
                end = start + base + (1 if i < extra else 0)
                formed.append(params[start:end])
                start = end
        else:
            wanted = set(params)
            formed = [[p for p in g if p in wanted] for g in groups]
        for group in formed:
            if len(group) < 2:
                continue  # alone: its own allreduce, as before
            group = _Group(group)
            for p in group:
                self._group_of[p] = group

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                self._ordered.append(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                if self.op == _core.ADASUM:  # as Horovod's Adasum optimizer: zeros to start
                    p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                # expand_as gives a view whose grad_fn's first input is p's accumulator.
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*_):
            group = self._group_of.get(p)
            if group is None:
                out = p in self._handles and self._handles[p][0] is not None
            else:  # its group's allreduce is out, or waits for the group's other gradients
                out = group in self._handles or p in self._group_ready.get(group, ())
            if out and self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "gradients were computed more than backward_passes_per_step times "
                    "before step(); raise backward_passes_per_step to accumulate locally")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0 or group is None:
                handle, ctx = None, None
                if self._allreduce_delay[p] == 0:
                    handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
                return
            ready = self._group_ready.setdefault(group, set())
            ready.add(p)
            self._handles[p] = (None, None)
            if len(ready) == len(group):
                self._submit_group(group)
        return hook

    def _submit_group(self, group):
        for p in group:
            self._handles.pop(p, None)
        self._group_ready.pop(group, None)
        self._handles[group] = self._grouped_allreduce_grad_async(group)

    def _grouped_allreduce_grad_async(self, group):
        compressed, ctxs = [], []
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse:
                if not self.sparse_as_dense:
                    raise ValueError(
                        "DistributedOptimizer: parameter '%s' has a sparse gradient, which a "
                        "group cannot allreduce; pass sparse_as_dense=True or leave it out of "
                        "groups" % self._parameter_names[p])
                p.grad = p.grad.to_dense()
                self._densified.add(p)
            c, ctx = self._compression.compress(p.grad)
            compressed.append(c)
            ctxs.append(ctx)
        prescale, postscale = self._scale_factors()
        handle = grouped_allreduce_async_(compressed, name=self._parameter_names[group[0]],
                                          op=self.op, prescale_factor=prescale,
                                          postscale_factor=postscale,
                                          process_set=self.process_set)
        return handle, ctxs

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
            self._densified.add(p)
        prescale, postscale = self._scale_factors()
        compressed, ctx = self._compression.compress(p.grad)
        handle = allreduce_async_(compressed, name=self._parameter_names[p], op=self.op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return handle, ctx

    def _scale_factors(self):
        """Average with gradient_predivide_factor f: divide by f before the sum, multiply by f
        (and the engine by 1/size) after."""
        if self.op == _core.AVERAGE:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

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
            group = self._group_of.get(p)
            if group is not None:
                if group not in self._handles:  # some member got no gradient (zeros, then)
                    self._submit_group(group)
            elif p not in self._handles or self._handles[p][0] is None:
                self._handles[p] = self._allreduce_grad_async(p)
        try:
            for key, (handle, ctx) in self._handles.items():
                output = synchronize(handle)
                if isinstance(key, tuple):
                    for p, out, c in zip(key, output, ctx):
                        self._apply_reduced(p, out, c)
                else:
                    self._apply_reduced(key, output, ctx)
        finally:  # after a failure too (an elastic reset), the next step starts afresh
            self._reset_step()
        self._synchronized = True

    def _apply_reduced(self, p, output, ctx):
        if output.is_sparse:
            p.grad = output.coalesce()
            return
        result = self._compression.decompress(output, ctx)
        if result is not p.grad:
            p.grad.copy_(result)
        if p in self._densified:
            self._densified.discard(p)
            p.grad = p.grad.to_sparse()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize() yourself first,
        e.g. to clip the averaged gradients). Not with op=hvd.Adasum, whose step() combines
        the ranks' changes: AssertionError, as in Horovod."""
        if self.op == _core.ADASUM and self._communicates:
            raise AssertionError("Skipping synchronization is not supported when using Adasum "
                                 "optimizer.")
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
    sparse). groups: a number of groups to split the parameters into, or lists of parameters;
    each group's gradients are allreduced together once all are ready (constructing the
    optimizer with a number is collective: the order comes from the set's first rank).
    num_groups: the older spelling of groups=N.
    """
    _process_set_id(process_set)
    if num_groups:
        warnings.warn("DistributedOptimizer(num_groups=...) is the older spelling of "
                      "groups=...; use groups", DeprecationWarning)
        if groups is None:
            groups = num_groups
    _check_groups(groups)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, process_set, sparse_as_dense, groups)


def _check_groups(groups):
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups >= 0):
        return
    if not isinstance(groups, (list, tuple)):
        raise ValueError("DistributedOptimizer: groups must be a number of groups (0 or more) "
                         "or a list of lists of torch.Tensor parameters; got %r" % (groups,))
    seen = set()
    for i, group in enumerate(groups):
        if not isinstance(group, (list, tuple)):
            raise ValueError("DistributedOptimizer: groups[%d] must be a list of torch.Tensor "
                             "parameters; got %s" % (i, type(group).__name__))
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError("DistributedOptimizer: groups[%d] holds a %s; groups must "
                                 "consist of torch.Tensor parameters" % (i, type(p).__name__))
            if id(p) in seen:
                raise ValueError("DistributedOptimizer: a parameter is in groups twice "
                                 "(groups[%d]); each may appear in one group once" % i)
            seen.add(id(p))
