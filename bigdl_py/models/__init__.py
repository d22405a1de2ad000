"""Reference models (BigDL's ``bigdl.models``): the networks the jobs, benchmarks and
tests share, defined once."""

from bigdl_py.models.dcgan import dcgan
from bigdl_py.models.gan import GAN, mlp_gan
from bigdl_py.models.lenet import lenet5
from bigdl_py.models.ncf import ncf
from bigdl_py.models.resnet import resnet18, resnet20
from bigdl_py.models.transformer_classifier import transformer_classifier

__all__ = [
    "GAN",
    "dcgan",
    "lenet5",
    "mlp_gan",
    "ncf",
    "resnet18",
    "resnet20",
    "transformer_classifier",
]
