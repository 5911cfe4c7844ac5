"""SyncBatchNorm: batch normalization over the batches of every rank, as horovod.torch's.

In training the mean and variance are those of the union of every rank's batch (the ranks'
batches may differ in size); the running statistics are updated from them as
torch.nn.BatchNorm does (the running variance unbiased over the whole batch). In evaluation it
normalizes with the running statistics, with no communication. The statistics go through two
differentiable Sum allreduces (the sums and count, then the squared deviations from the
global mean), so autograd gives every rank its share of the gradient of the sum of every
rank's loss, as one BatchNorm over the union would.
"""

import torch
import torch.nn.functional as F

from hvd import Sum, global_process_set
from hvd.torch.mpi_ops import allreduce


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d whose batch statistics span every rank of
    process_set (all of them by default). Input: (N, C) or (N, C, ...)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        training = self.training or not self.track_running_stats
        if not training:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average
            momentum = 1.0 / float(self.num_batches_tracked)

        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.to(torch.float64) if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.full((1,), x.numel() / c, dtype=x.dtype, device=x.device)
        sums = allreduce(torch.cat([x.sum(dims), count]), op=Sum, process_set=self.process_set)
        total = sums[c].detach()
        if total <= 1:
            raise ValueError("SyncBatchNorm needs more than one value per channel over all "
                             "ranks in training, got %d" % int(total))
        mean = sums[:c] / total
        shape = [1, c] + [1] * (input.dim() - 2)
        centered = x - mean.view(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum,
                        process_set=self.process_set) / total
        if self.training and self.track_running_stats:
            with torch.no_grad():
                unbiased = var.detach() * total / (total - 1)
                self.running_mean.mul_(1 - momentum).add_(mean.detach().to(self.running_mean.dtype),
                                                          alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased.to(self.running_var.dtype),
                                                         alpha=momentum)
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

