"""horovod.torch.elastic.sampler's name for the sampler (hvd.torch.elastic holds it)."""

from hvd.torch.elastic import ElasticSampler  # noqa: F401
