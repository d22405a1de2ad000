"""The models ``bench/engine.py`` times, each built alike in bigdl_py and in PyTorch.

A ``ModelSpec`` says how to build the bigdl_py model, how to build its PyTorch twin (same
layers under the same parameter names, so the twin loads bigdl_py's ``state_dict`` with
``strict=True`` and both start from the same weights), how to draw a batch and which loss
the step takes. The zoo models come from ``bigdl_py.models``; a spec whose model is not
there yet (``requires``) is skipped by the bench with a printed note. PyTorch is only the
yardstick here: bigdl_py never imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bigdl_py import nn
from bigdl_py.autograd import ops


@dataclass(frozen=True)
class ModelSpec:
    """One bench entry. ``loss`` is ``"nll"`` (the model ends in LogSoftmax),
    ``"cross_entropy"`` (logits) or ``"mse"`` (one score per sample)."""

    name: str
    build: Callable[[], nn.Module]
    build_torch: Callable[..., object]  # (torch) -> torch.nn.Module
    batch: Callable[[int], tuple[np.ndarray, np.ndarray]]  # (seed) -> (inputs, targets)
    loss: str
    requires: str | None = None  # the bigdl_py.models function the spec needs

    def missing(self) -> str | None:
        """Why the spec cannot run here (its zoo model is not in bigdl_py.models), or None."""
        if self.requires is None:
            return None
        models = importlib.import_module("bigdl_py.models")
        if hasattr(models, self.requires):
            return None
        return f"bigdl_py.models.{self.requires} does not exist yet"


# --- models made of one layer list (the same names in both libraries) -------------------------

# (layer class name, positional arguments, keyword arguments): the same in both libraries.
LENET5 = [
    ("Conv2d", (1, 6, 5), {}),
    ("Tanh", (), {}),
    ("MaxPool2d", (2,), {}),
    ("Conv2d", (6, 12, 5), {}),
    ("Tanh", (), {}),
    ("MaxPool2d", (2,), {}),
    ("Flatten", (), {}),
    ("Linear", (192, 100), {}),
    ("Tanh", (), {}),
    ("Linear", (100, 10), {}),
    ("LogSoftmax", (), {"dim": 1}),
]
MLP = [
    ("Linear", (784, 512), {}),
    ("ReLU", (), {}),
    ("Linear", (512, 512), {}),
    ("ReLU", (), {}),
    ("Linear", (512, 10), {}),
    ("LogSoftmax", (), {"dim": 1}),
]
CIFAR_CNN = [
    ("Conv2d", (3, 32, 3), {"padding": 1}),
    ("ReLU", (), {}),
    ("Conv2d", (32, 32, 3), {"padding": 1}),
    ("ReLU", (), {}),
    ("MaxPool2d", (2,), {}),
    ("Conv2d", (32, 64, 3), {"padding": 1}),
    ("ReLU", (), {}),
    ("Conv2d", (64, 64, 3), {"padding": 1}),
    ("ReLU", (), {}),
    ("MaxPool2d", (2,), {}),
    ("Flatten", (), {}),
    ("Linear", (4096, 256), {}),
    ("ReLU", (), {}),
    ("Linear", (256, 10), {}),
    ("LogSoftmax", (), {"dim": 1}),
]


def build(library_nn, layers):
    """``Sequential`` of ``layers`` from ``bigdl_py.nn`` or ``torch.nn``."""
    return library_nn.Sequential(
        *(getattr(library_nn, name)(*args, **kwargs) for name, args, kwargs in layers)
    )


def images(shape, classes: int = 10):
    """A batch maker: standard-normal float32 inputs of ``shape`` and class labels."""

    def make(seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        inputs = rng.standard_normal(shape).astype(np.float32)
        return inputs, rng.integers(0, classes, size=shape[0])

    return make


def sequential_spec(name: str, layers, input_shape) -> ModelSpec:
    return ModelSpec(
        name=name,
        build=lambda: build(nn, layers),
        build_torch=lambda torch: build(torch.nn, layers),
        batch=images(input_shape),
        loss="nll",
    )


# --- ResNet-18, CIFAR form (bigdl_py.models.resnet18) --------------------------------------------


def torch_resnet18(torch, num_classes: int = 10):
    """torchvision's ResNet-18 names with the CIFAR stem, as ``bigdl_py.models.resnet``."""
    tnn = torch.nn

    class BasicBlock(tnn.Module):
        def __init__(self, in_channels, out_channels, stride=1):
            super().__init__()
            self.conv1 = tnn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
            self.bn1 = tnn.BatchNorm2d(out_channels)
            self.relu = tnn.ReLU()
            self.conv2 = tnn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
            self.bn2 = tnn.BatchNorm2d(out_channels)
            self.downsample = None
            if stride != 1 or in_channels != out_channels:
                self.downsample = tnn.Sequential(
                    tnn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                    tnn.BatchNorm2d(out_channels),
                )

        def forward(self, x):
            shortcut = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + shortcut)

    class ResNet(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(3, 64, 3, padding=1, bias=False)
            self.bn1 = tnn.BatchNorm2d(64)
            self.relu = tnn.ReLU()
            channels = 64
            for stage, width in enumerate((64, 128, 256, 512)):
                stride = 1 if stage == 0 else 2
                blocks = [BasicBlock(channels, width, stride), BasicBlock(width, width)]
                setattr(self, f"layer{stage + 1}", tnn.Sequential(*blocks))
                channels = width
            self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
            self.fc = tnn.Linear(channels, num_classes)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            for stage in range(4):
                x = getattr(self, f"layer{stage + 1}")(x)
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


# --- NCF (bigdl_py.models.ncf) -----------------------------------------------------------------

# MovieLens-1M's id ranges; NeuMF's default sizes (GMF 16, MLP 64-32-16).
NCF_USERS, NCF_ITEMS, NCF_BATCH = 6040, 3706, 1024


def torch_ncf(
    torch, num_users=NCF_USERS, num_items=NCF_ITEMS, embedding_dim=16, hidden=(64, 32, 16)
):
    """NeuMF with ``bigdl_py.models.ncf``'s names: GMF and MLP branches, one ``predict``."""
    tnn = torch.nn

    class NCF(tnn.Module):
        def __init__(self):
            super().__init__()
            self.user_mlp = tnn.Embedding(num_users, hidden[0] // 2)
            self.item_mlp = tnn.Embedding(num_items, hidden[0] // 2)
            layers = []
            for width_in, width_out in zip(hidden[:-1], hidden[1:], strict=True):
                layers += [tnn.Linear(width_in, width_out), tnn.ReLU()]
            self.mlp = tnn.Sequential(*layers)
            self.user_gmf = tnn.Embedding(num_users, embedding_dim)
            self.item_gmf = tnn.Embedding(num_items, embedding_dim)
            self.predict = tnn.Linear(hidden[-1] + embedding_dim, 1)

        def forward(self, pairs):
            users, items = pairs[:, 0], pairs[:, 1]
            features = self.mlp(torch.cat([self.user_mlp(users), self.item_mlp(items)], 1))
            product = self.user_gmf(users) * self.item_gmf(items)
            return self.predict(torch.cat([product, features], 1)).reshape(-1)

    return NCF()


def ncf_batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(user, item) id pairs and ratings in [1, 5]."""
    rng = np.random.default_rng(seed)
    pairs = np.stack(
        [rng.integers(0, NCF_USERS, NCF_BATCH), rng.integers(0, NCF_ITEMS, NCF_BATCH)], axis=1
    )
    return pairs, rng.integers(1, 6, NCF_BATCH).astype(np.float32)


def build_ncf():
    from bigdl_py import models

    return models.ncf(NCF_USERS, NCF_ITEMS)


def build_resnet18():
    from bigdl_py import models

    return models.resnet18(10)


# --- bidirectional LSTM text classifier (defined here, from bigdl_py.nn) ------------------------

# Token ids of sequences of 128, like the Transformer entry; two classes.
TEXT_VOCABULARY, TEXT_LENGTH, TEXT_BATCH = 10000, 128, 32
LSTM_EMBEDDING, LSTM_HIDDEN = 128, 128


class BiLSTMClassifier(nn.Module):
    """Embedding, one bidirectional LSTM, and a Linear on both directions' last states."""

    def __init__(
        self, vocabulary=TEXT_VOCABULARY, embedding=LSTM_EMBEDDING, hidden=LSTM_HIDDEN, classes=2
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        _, (last_hidden, _) = self.lstm(self.embedding(ids))
        return self.fc(ops.concatenate([last_hidden[0], last_hidden[1]], axis=1))


def torch_bilstm(
    torch, vocabulary=TEXT_VOCABULARY, embedding=LSTM_EMBEDDING, hidden=LSTM_HIDDEN, classes=2
):
    tnn = torch.nn

    class TorchBiLSTMClassifier(tnn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = tnn.Embedding(vocabulary, embedding)
            self.lstm = tnn.LSTM(embedding, hidden, batch_first=True, bidirectional=True)
            self.fc = tnn.Linear(2 * hidden, classes)

        def forward(self, ids):
            _, (last_hidden, _) = self.lstm(self.embedding(ids))
            return self.fc(torch.cat([last_hidden[0], last_hidden[1]], 1))

    return TorchBiLSTMClassifier()


def token_batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TEXT_VOCABULARY, size=(TEXT_BATCH, TEXT_LENGTH))
    return ids, rng.integers(0, 2, size=TEXT_BATCH)


# --- Transformer text classifier (bigdl_py.models.transformer_classifier) ------------------------

TRANSFORMER_WIDTH, TRANSFORMER_HEADS, TRANSFORMER_LAYERS = 128, 4, 2


def build_transformer():
    from bigdl_py import models

    return models.transformer_classifier(
        TEXT_VOCABULARY, 2, TRANSFORMER_WIDTH, TRANSFORMER_HEADS, TRANSFORMER_LAYERS
    )


def torch_transformer(
    torch,
    vocabulary=TEXT_VOCABULARY,
    classes=2,
    d_model=TRANSFORMER_WIDTH,
    nhead=TRANSFORMER_HEADS,
    num_layers=TRANSFORMER_LAYERS,
    max_length=512,
    dropout=0.1,
):
    """``bigdl_py.models.TransformerClassifier`` in PyTorch: token + learned position
    embeddings (token 0 is padding), a batch-first encoder, a mean over the real tokens."""
    tnn = torch.nn

    class TransformerClassifier(tnn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = tnn.Embedding(vocabulary, d_model, padding_idx=0)
            self.position_embedding = tnn.Embedding(max_length, d_model)
            layer = tnn.TransformerEncoderLayer(
                d_model, nhead, 4 * d_model, dropout, batch_first=True
            )
            self.encoder = tnn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
            self.classifier = tnn.Linear(d_model, classes)

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.token_embedding(ids) + self.position_embedding(positions)
            padding = ids == 0
            kept = (~padding).sum(dim=1, keepdim=True)
            encoded = self.encoder(x, src_key_padding_mask=padding)
            weights = ((~padding) / kept).to(encoded.dtype)[:, :, None]
            return self.classifier((encoded * weights).sum(dim=1))

    return TransformerClassifier()


# key -> spec; ``bench/engine.py --models`` takes the keys.
MODELS: dict[str, ModelSpec] = {
    "lenet": sequential_spec("LeNet-5", LENET5, (128, 1, 28, 28)),
    "mlp": sequential_spec("MLP", MLP, (256, 784)),
    "cnn": sequential_spec("CIFAR CNN", CIFAR_CNN, (64, 3, 32, 32)),
    "resnet18": ModelSpec(
        name="ResNet-18 (CIFAR), batch 64",
        build=build_resnet18,
        build_torch=torch_resnet18,
        batch=images((64, 3, 32, 32)),
        loss="cross_entropy",
        requires="resnet18",
    ),
    "transformer": ModelSpec(
        name=f"Transformer classifier (2 layers, d 128, 4 heads), seq {TEXT_LENGTH}, "
        f"batch {TEXT_BATCH}",
        build=build_transformer,
        build_torch=torch_transformer,
        batch=token_batch,
        loss="cross_entropy",
        requires="transformer_classifier",
    ),
    "bilstm": ModelSpec(
        name=f"BiLSTM classifier, seq {TEXT_LENGTH}, batch {TEXT_BATCH}",
        build=BiLSTMClassifier,
        build_torch=torch_bilstm,
        batch=token_batch,
        loss="cross_entropy",
    ),
    "ncf": ModelSpec(
        name=f"NCF (NeuMF), batch {NCF_BATCH}",
        build=build_ncf,
        build_torch=torch_ncf,
        batch=ncf_batch,
        loss="mse",
        requires="ncf",
    ),
}
