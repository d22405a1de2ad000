"""Recurrent layers: ``LSTM``, ``GRU`` and ``RNN`` (BigDL's ``Recurrent().add(LSTM(...))``).

Each layer runs a whole (multi-layer) sequence. Parameter names, shapes, gate order and the
default initialisation are PyTorch's, so a PyTorch ``state_dict`` loads as is::

    lstm = nn.LSTM(8, 16, num_layers=2)
    lstm.load_state_dict({k: v.numpy() for k, v in torch_lstm.state_dict().items()})

Per layer, the input projection of all time steps is one GEMM per direction, and the
recurrence of both directions and its backward through time are one fused node
(``_recurrent_functions.py``), so long sequences neither deepen the graph nor slow the
backward walk.
"""

from __future__ import annotations

import math
from typing import Any

from bigdl_py.autograd import ops
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn import init
from bigdl_py.nn._recurrent_functions import GRUSequence, LSTMSequence, RNNSequence
from bigdl_py.nn.layers._arguments import check_flag, check_positive_int, check_probability
from bigdl_py.nn.layers._base import empty_parameter, parameter_dtype
from bigdl_py.nn.module import Module

__all__ = ["GRU", "LSTM", "RNN"]


class _Recurrent(Module):
    """What LSTM, GRU and RNN share: parameters, checks, the loop over layers."""

    _gate_count = 0  # gates stacked in each weight: 4 for LSTM, 3 for GRU, 1 for RNN
    _sequence_function: Any = None  # the fused Function that runs one layer

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = None,
    ):
        super().__init__()
        name = type(self).__name__
        self.input_size = check_positive_int(input_size, "input_size", name)
        self.hidden_size = check_positive_int(hidden_size, "hidden_size", name)
        self.num_layers = check_positive_int(num_layers, "num_layers", name)
        self.bias = check_flag(bias, "bias", name)
        self.batch_first = check_flag(batch_first, "batch_first", name)
        self.dropout = check_probability(dropout, "dropout", name)
        self.bidirectional = check_flag(bidirectional, "bidirectional", name)
        dtype = parameter_dtype(dtype, name)
        gate_width = self._gate_count * self.hidden_size
        # PyTorch's registration order (and so the flat-parameter layout): per layer and
        # direction (forward, then "_reverse"), weight_ih, weight_hh, bias_ih, bias_hh.
        for layer in range(self.num_layers):
            layer_input = self.input_size if layer == 0 else self.hidden_size * self.directions
            for suffix in self._suffixes:
                tag = f"l{layer}{suffix}"
                weight_ih = empty_parameter((gate_width, layer_input), dtype)
                setattr(self, f"weight_ih_{tag}", weight_ih)
                setattr(self, f"weight_hh_{tag}", empty_parameter((gate_width, hidden_size), dtype))
                if self.bias:
                    setattr(self, f"bias_ih_{tag}", empty_parameter((gate_width,), dtype))
                    setattr(self, f"bias_hh_{tag}", empty_parameter((gate_width,), dtype))
        self.reset_parameters()

    @property
    def directions(self) -> int:
        """1, or 2 when bidirectional."""
        return 2 if self.bidirectional else 1

    @property
    def _suffixes(self) -> tuple[str, ...]:
        """Parameter-name suffix of each direction, as in PyTorch."""
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self) -> None:
        """PyTorch's default: every weight and bias from ``U(-1/sqrt(H), 1/sqrt(H))``."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for parameter in self.parameters():
            init.uniform_(parameter, -bound, bound)

    # --- checks -------------------------------------------------------------------------
    def _label(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def _checked_input(self, x: Any) -> Tensor:
        x = x if isinstance(x, Tensor) else Tensor(x, _copy=False)
        layout = "(N, T, input_size)" if self.batch_first else "(T, N, input_size)"
        if x.ndim != 3 or x.shape[-1] != self.input_size:
            raise ValueError(
                f"{self._label()}: expects {layout} input with input_size={self.input_size}, "
                f"got shape {x.shape}"
            )
        if x.shape[1 if self.batch_first else 0] == 0:
            raise ValueError(f"{self._label()}: the input sequence is empty (shape {x.shape})")
        if x.dtype != self.weight_ih_l0.dtype:
            raise TypeError(
                f"{self._label()}: input dtype {x.dtype} differs from the parameters' "
                f"{self.weight_ih_l0.dtype}; convert one with .to(dtype=...)"
            )
        return x

    def _checked_state(self, state: Any, what: str, batch: int) -> Tensor:
        """A given initial state as a Tensor of shape ``(num_layers * directions, N, H)``."""
        state = state if isinstance(state, Tensor) else Tensor(state, _copy=False)
        expected = (self.num_layers * self.directions, batch, self.hidden_size)
        if state.shape != expected:
            layers = "num_layers * 2" if self.bidirectional else "num_layers"
            raise ValueError(
                f"{self._label()}: initial {what} must have shape ({layers}, N, "
                f"hidden_size) = {expected}, got {state.shape}"
            )
        if state.dtype != self.weight_ih_l0.dtype:
            raise TypeError(
                f"{self._label()}: initial {what} has dtype {state.dtype} but the parameters "
                f"are {self.weight_ih_l0.dtype}; convert one with .to(dtype=...)"
            )
        return state

    def _per_layer(self, state: Tensor | None, like: Tensor, batch: int) -> list:
        """The initial state of each layer, ``(directions, N, H)`` (PyTorch's rows: layer 0
        forward, layer 0 reverse, layer 1 forward, ...): slices of ``state``, or zeros when
        None."""
        directions = self.directions
        if state is None:
            with like.device.activate():
                zeros = like.device.xp.zeros(
                    (directions, batch, self.hidden_size), dtype=like.dtype
                )
            return [Tensor(zeros, _copy=False)] * self.num_layers
        return [
            ops.getitem(state, slice(layer * directions, (layer + 1) * directions))
            for layer in range(self.num_layers)
        ]

    # --- running ------------------------------------------------------------------------
    def _time_index(self, index) -> tuple:
        """An index that picks ``index`` along the time axis of a sequence."""
        return (slice(None), index) if self.batch_first else (index,)

    def _layer_parameters(self, layer: int, kind: str) -> Tensor | None:
        """``kind`` (``"weight_ih"``, ...) of every direction of ``layer`` on a new leading
        direction axis (a view when there is one direction)."""
        if kind.startswith("bias") and not self.bias:
            return None
        parts = [getattr(self, f"{kind}_l{layer}{suffix}") for suffix in self._suffixes]
        if len(parts) == 1:
            return ops.reshape(parts[0], (1, *parts[0].shape))
        return ops.stack(parts, axis=0)

    def _run_layers(self, x: Tensor, initial_states: list[tuple]) -> tuple[Tensor, list]:
        """Run every layer; ``initial_states[k]`` holds the states (h, or h and c) of layer
        k, each ``(directions, N, H)``.

        Returns the last layer's output sequence (the directions joined along the features)
        and the final states of every layer, each ``(directions, N, H)``.
        """
        sequence, final_states = x, []
        steps = x.shape[1 if self.batch_first else 0]
        batch = x.shape[0 if self.batch_first else 1]
        for layer in range(self.num_layers):
            weights = [self._layer_parameters(layer, kind) for kind in ("weight_ih", "weight_hh")]
            biases = [self._layer_parameters(layer, kind) for kind in ("bias_ih", "bias_hh")]
            packed = self._recur(
                sequence, *weights, initial_states[layer], biases if self.bias else []
            )
            sequence = ops.getitem(packed, self._time_index(slice(0, steps)))
            # Rows T, T + 1, ... of the packed output are the final states, (N, D * H) each.
            final_states.append(
                tuple(
                    ops.permute(
                        ops.reshape(
                            ops.getitem(packed, self._time_index(steps + row)),
                            (batch, self.directions, self.hidden_size),
                        ),
                        (1, 0, 2),
                    )
                    for row in range(len(initial_states[layer]))
                )
            )
            if self.dropout and self.training and layer < self.num_layers - 1:
                sequence = ops.dropout(sequence, self.dropout)
        return sequence, final_states

    def _recur(self, x, weight_ih, weight_hh, states, biases) -> Tensor:
        """One layer, both directions, as one node of the graph."""
        return self._sequence_function.apply(
            x,
            weight_ih,
            weight_hh,
            *states,
            *biases,
            batch_first=self.batch_first,
            **self._cell_options(),
        )

    def _cell_options(self) -> dict:
        """Settings of the cell passed to ``_sequence_function`` (the RNN's nonlinearity)."""
        return {}

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if not self.bias:
            text += ", bias=False"
        if self.batch_first:
            text += ", batch_first=True"
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text


class LSTM(_Recurrent):
    """Multi-layer long short-term memory over a sequence (PyTorch's ``nn.LSTM``).

    For each step, with ``x`` the layer's input and ``(h, c)`` its previous state::

        i, f, g, o = split(x @ W_ih.T + b_ih + h @ W_hh.T + b_hh, 4)
        c = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h = sigmoid(o) * tanh(c)

    Parameters
    ----------
    input_size : int
        Features of each input step.
    hidden_size : int
        Size ``H`` of the hidden and cell states.
    num_layers : int
        Stacked layers; layer ``k > 0`` reads layer ``k - 1``'s hidden sequence.
    bias : bool
        Learn ``b_ih`` and ``b_hh`` (default True).
    batch_first : bool
        Input and output are ``(T, N, F)`` (default False, as in PyTorch) or, when True,
        ``(N, T, F)`` (BigDL's layout). Until format version 2 of ``nn.save`` the default
        was True; model files written then still load as saved.
    dropout : float
        Dropout on each layer's output except the last, in training only.
    bidirectional : bool
        Also run each layer back to front and join both directions' hidden states along the
        features, so outputs have ``2H`` features (default False).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    Parameters ``weight_ih_l{k}`` ``(4H, in)``, ``weight_hh_l{k}`` ``(4H, H)``,
    ``bias_ih_l{k}`` and ``bias_hh_l{k}`` ``(4H,)``, and with ``bidirectional`` the same
    with the suffix ``_reverse``; ``in`` is ``input_size`` for layer 0, ``H`` (``2H`` when
    bidirectional) above. Gates are in PyTorch's order ``[input, forget, cell, output]``,
    all initialised from ``U(-1/sqrt(H), 1/sqrt(H))``, so PyTorch weights copy over by name.
    """

    _gate_count = 4
    _sequence_function = LSTMSequence

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = None,
    ):
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype
        )

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        """Run the sequence.

        Parameters
        ----------
        input : Tensor
            ``(T, N, input_size)`` (``(N, T, input_size)`` when ``batch_first=True``).
        hx : (Tensor, Tensor), optional
            Initial ``(h_0, c_0)``, each ``(num_layers * D, N, hidden_size)`` with ``D`` 2
            when bidirectional, else 1; zeros if omitted.

        Returns
        -------
        output : Tensor
            The last layer's hidden state at every step, ``(T, N, D * H)`` (or
            ``(N, T, D * H)``); when bidirectional, the forward direction's features first.
        (h_n, c_n) : (Tensor, Tensor)
            The final hidden and cell states of every layer and direction, each
            ``(num_layers * D, N, H)``, ordered layer 0 forward, layer 0 reverse, layer 1
            forward, ... (a reverse direction's final state is the one at the first step).
        """
        x = self._checked_input(input)
        batch = x.shape[0] if self.batch_first else x.shape[1]
        if hx is None:
            hidden = cell = None
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            hidden = self._checked_state(hx[0], "hidden state h_0", batch)
            cell = self._checked_state(hx[1], "cell state c_0", batch)
        else:
            raise TypeError(f"{self._label()}: hx must be a pair (h_0, c_0) or None, got {hx!r}")
        hiddens, cells = self._per_layer(hidden, x, batch), self._per_layer(cell, x, batch)
        initial = list(zip(hiddens, cells, strict=True))
        output, finals = self._run_layers(x, initial)
        return output, (_join_layers([h for h, _ in finals]), _join_layers([c for _, c in finals]))


class _HiddenStateRecurrent(_Recurrent):
    """GRU and RNN: layers whose only state is the hidden state."""

    def forward(self, input, hx=None):  # noqa: A002 - PyTorch's argument name
        """Run the sequence.

        Parameters
        ----------
        input : Tensor
            ``(T, N, input_size)`` (``(N, T, input_size)`` when ``batch_first=True``).
        hx : Tensor, optional
            Initial hidden state ``(num_layers * D, N, hidden_size)``; zeros if omitted.

        Returns
        -------
        output : Tensor
            The last layer's hidden state at every step, ``(T, N, D * H)`` (or
            ``(N, T, D * H)``).
        h_n : Tensor
            The final hidden state of every layer and direction, ``(num_layers * D, N, H)``,
            ordered as for :class:`LSTM` (layer 0 forward, layer 0 reverse, layer 1 forward,
            ...).
        """
        x = self._checked_input(input)
        batch = x.shape[0] if self.batch_first else x.shape[1]
        hidden = None if hx is None else self._checked_state(hx, "hidden state h_0", batch)
        initial = [(h0,) for h0 in self._per_layer(hidden, x, batch)]
        output, finals = self._run_layers(x, initial)
        return output, _join_layers([h for (h,) in finals])


class GRU(_HiddenStateRecurrent):
    """Multi-layer gated recurrent unit over a sequence (PyTorch's ``nn.GRU``).

    For each step, with ``x`` the layer's input and ``h`` the previous hidden state::

        x_r, x_z, x_n = split(x @ W_ih.T + b_ih, 3)
        h_r, h_z, h_n = split(h @ W_hh.T + b_hh, 3)
        r = sigmoid(x_r + h_r);  z = sigmoid(x_z + h_z)
        n = tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h

    Parameters
    ----------
    input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype
        As for :class:`LSTM`.

    Notes
    -----
    Parameters as for :class:`LSTM` with ``3H`` rows, gates in PyTorch's order
    ``[reset, update, new]``.
    """

    _gate_count = 3
    _sequence_function = GRUSequence

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = None,
    ):
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype
        )


class RNN(_HiddenStateRecurrent):
    """Multi-layer Elman recurrent network over a sequence (PyTorch's ``nn.RNN``).

    For each step, with ``x`` the layer's input and ``h`` the previous hidden state::

        h = nonlinearity(x @ W_ih.T + b_ih + h @ W_hh.T + b_hh)

    Parameters
    ----------
    input_size, hidden_size, num_layers
        As for :class:`LSTM`.
    nonlinearity : {"tanh", "relu"}
        The activation of each step (default ``"tanh"``).
    bias, batch_first, dropout, bidirectional, dtype
        As for :class:`LSTM` (``batch_first=False`` by default: ``(T, N, F)``, PyTorch's).

    Notes
    -----
    Parameters as for :class:`LSTM` with ``H`` rows: ``weight_ih_l{k}`` ``(H, in)``,
    ``weight_hh_l{k}`` ``(H, H)``, ``bias_ih_l{k}`` and ``bias_hh_l{k}`` ``(H,)`` (suffix
    ``_reverse`` for the reverse direction), initialised from ``U(-1/sqrt(H), 1/sqrt(H))``,
    PyTorch's names and order, so a PyTorch ``nn.RNN``'s weights copy over by name. The
    arguments are in PyTorch's order too: ``nonlinearity`` comes fourth, before ``bias``.
    """

    _gate_count = 1
    _sequence_function = RNNSequence

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        dtype: Any = None,
    ):
        choices = RNNSequence.nonlinearities
        if not isinstance(nonlinearity, str) or nonlinearity not in choices:
            raise ValueError(f"RNN: nonlinearity must be one of {choices}, got {nonlinearity!r}")
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, dtype
        )
        self.nonlinearity = nonlinearity

    def _cell_options(self) -> dict:
        return {"nonlinearity": self.nonlinearity}

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.nonlinearity == "tanh" else f"{text}, nonlinearity='relu'"


def _join_layers(states: list) -> Tensor:
    """Per-layer ``(directions, N, H)`` states as one ``(num_layers * directions, N, H)``."""
    return states[0] if len(states) == 1 else ops.concatenate(states, axis=0)
