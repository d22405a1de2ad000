"""Reference models (BigDL's ``bigdl.models``): the networks the jobs, benchmarks and
tests share, defined once."""

from bigdl_py.models.lenet import lenet5
from bigdl_py.models.ncf import ncf
from bigdl_py.models.resnet import resnet18, resnet20

__all__ = ["lenet5", "ncf", "resnet18", "resnet20"]
