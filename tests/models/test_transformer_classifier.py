"""The Transformer text classifier: PyTorch parity through safetensors, padding, training."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.models import transformer_classifier
from bigdl_py.models.transformer_classifier import TransformerClassifier

VOCAB, CLASSES, LENGTH = 50, 3, 12


def torch_classifier(torch, d_model, nhead, num_layers, max_length):
    """The same model written in PyTorch, with the same attribute names."""
    tnn = torch.nn

    class Classifier(tnn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = tnn.Embedding(VOCAB, d_model, padding_idx=0)
            self.position_embedding = tnn.Embedding(max_length, d_model)
            layer = tnn.TransformerEncoderLayer(
                d_model, nhead, 4 * d_model, dropout=0.1, batch_first=True
            )
            self.encoder = tnn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
            self.classifier = tnn.Linear(d_model, CLASSES)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1])
            x = self.token_embedding(tokens) + self.position_embedding(positions)
            padding = tokens == 0
            encoded = self.encoder(x, src_key_padding_mask=padding)
            weights = (~padding).float() / (~padding).sum(dim=1, keepdim=True)
            return self.classifier((encoded * weights[:, :, None]).sum(dim=1))

    return Classifier()


@pytest.fixture
def tokens(rng):
    ids = rng.integers(1, VOCAB, size=(4, LENGTH))
    ids[1, 7:] = 0  # padded sequences
    ids[3, 2:] = 0
    return ids


def test_pytorch_weights_load_and_outputs_match(tmp_path, torch, tokens):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    reference = torch_classifier(torch, 16, 4, 2, 32).eval()
    path = tmp_path / "classifier.safetensors"
    safetensors_torch.save_file(reference.state_dict(), str(path))
    model = TransformerClassifier(VOCAB, CLASSES, 16, 4, 2, max_length=32)
    assert list(model.state_dict()) == list(reference.state_dict())
    nn.load_safetensors(model, path)
    model.eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(model(tokens).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_padding_changes_nothing_and_bad_input_is_refused(tokens):
    model = transformer_classifier(VOCAB, CLASSES, d_model=16, nhead=2, num_layers=1).eval()
    logits = model(tokens).numpy()
    assert logits.shape == (4, CLASSES)
    longer = np.concatenate([tokens, np.zeros((4, 3), tokens.dtype)], axis=1)
    np.testing.assert_allclose(model(longer).numpy(), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model(Tensor(tokens.astype(np.float32))).numpy(), logits)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 50\)"):
        model(np.full((1, 3), VOCAB))
    with pytest.raises(ValueError, match="max_length=512"):
        model(np.ones((1, 513), np.int64))
    with pytest.raises(ValueError, match="padding tokens only"):
        model(np.zeros((1, 4), np.int64))


def test_a_few_sgd_steps_lower_the_loss(tokens, sgd_losses):
    labels = np.array([0, 1, 2, 1])
    model = TransformerClassifier(VOCAB, CLASSES, 16, 2, 1, max_length=LENGTH, dropout=0.0)
    loss = nn.CrossEntropyLoss()
    losses = sgd_losses(model, lambda m: loss(m(tokens), labels), steps=3, lr=0.1)
    assert losses[-1] < losses[0]


def test_save_load_round_trip(tmp_path, tokens):
    model = TransformerClassifier(VOCAB, CLASSES, 16, 2, 1, max_length=LENGTH).eval()
    path = tmp_path / "classifier.bigdl"
    nn.save(model, path)
    loaded = nn.load(path)
    assert isinstance(loaded, TransformerClassifier)
    np.testing.assert_array_equal(loaded(tokens).numpy(), model(tokens).numpy())
