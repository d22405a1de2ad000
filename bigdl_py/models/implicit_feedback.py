"""Implicit-feedback recommendation data and its metric, as the NCF paper evaluates it.

Every ``(user, item)`` interaction is a positive. :func:`leave_latest_out` holds out each
user's latest interaction; :func:`sample_negatives` draws items a user never interacted with
as negatives for training; :func:`hit_rate_at_k` ranks each held-out item among items the
user never interacted with and counts how often it lands in the top ``k`` (He et al. 2017
use 99 sampled candidates and ``k = 10``). Plain NumPy on the driver, for data the size of
MovieLens; the model trains on Spark.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# Rejection sampling redraws the colliding draws; each round removes most of them, so a
# draw still colliding after this many rounds means a user has interacted with nearly
# every item.
_MAX_REDRAWS = 100


def _codes(users: np.ndarray, items: np.ndarray, num_items: int) -> np.ndarray:
    """One int64 per (user, item) pair."""
    return users.astype(np.int64) * num_items + items.astype(np.int64)


def leave_latest_out(
    users: np.ndarray, items: np.ndarray, timestamps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Split interactions into training ones and each user's latest one.

    Parameters
    ----------
    users, items, timestamps : 1-d arrays of equal length
        One interaction per position; among equal timestamps the later position counts
        as later.

    Returns
    -------
    (train_index, held_out_index) : two int64 index arrays into the inputs
        ``held_out_index`` has one entry per user, sorted by user.

    Raises
    ------
    ValueError
        If the arrays are empty or differ in length.
    """
    users, timestamps = np.asarray(users), np.asarray(timestamps)
    if not len(users) or not len(users) == len(items) == len(timestamps):
        raise ValueError(
            f"leave_latest_out: users, items and timestamps must be non-empty and of equal "
            f"length, got {len(users)}, {len(items)}, {len(timestamps)}"
        )
    order = np.lexsort((np.arange(len(users)), timestamps, users))  # by user, then time
    last_of_user = np.r_[users[order][1:] != users[order][:-1], True]
    held_out = order[last_of_user]
    train = np.setdiff1d(np.arange(len(users)), held_out)
    return train, held_out


def _items_not_interacted(
    users: np.ndarray, interacted: np.ndarray, num_items: int, rng: np.random.Generator
) -> np.ndarray:
    """One uniformly drawn item per entry of ``users`` that the user never interacted with."""
    items = rng.integers(0, num_items, size=len(users))
    colliding = np.isin(_codes(users, items, num_items), interacted)
    for _ in range(_MAX_REDRAWS):
        if not colliding.any():
            return items
        items[colliding] = rng.integers(0, num_items, size=int(colliding.sum()))
        colliding[colliding] = np.isin(
            _codes(users[colliding], items[colliding], num_items), interacted
        )
    raise ValueError(
        "cannot draw items a user never interacted with: some user has interacted with "
        "nearly every item"
    )


def sample_negatives(
    users: np.ndarray,
    items: np.ndarray,
    num_items: int,
    per_positive: int,
    rng: np.random.Generator,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Training pairs and 0/1 labels: the positives and ``per_positive`` negatives each.

    Parameters
    ----------
    users, items : 1-d integer arrays
        The positive interactions.
    num_items : int
        Items are ``0 .. num_items - 1``.
    per_positive : int
        Negatives drawn for each positive, for the same user, uniformly among the items
        the user never interacted with.
    rng : numpy.random.Generator
    exclude : (users, items), optional
        Further interactions never to draw as negatives (the held-out ones).

    Returns
    -------
    (pairs, labels) : ``(M, 2)`` int64 ``(user, item)`` pairs and ``(M,)`` float32 labels
        Positives first, then negatives.
    """
    if per_positive < 0:
        raise ValueError(f"sample_negatives: per_positive must be >= 0, got {per_positive}")
    users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
    interacted = _codes(users, items, num_items)
    if exclude is not None:
        interacted = np.concatenate([interacted, _codes(*exclude, num_items)])
    interacted = np.unique(interacted)
    negative_users = np.repeat(users, per_positive)
    negative_items = _items_not_interacted(negative_users, interacted, num_items, rng)
    pairs = np.concatenate(
        [np.stack([users, items], axis=1), np.stack([negative_users, negative_items], axis=1)]
    )
    labels = np.r_[np.ones(len(users), np.float32), np.zeros(len(negative_users), np.float32)]
    return pairs, labels


def hit_rate_at_k(
    score: Callable[[np.ndarray], np.ndarray],
    held_out: np.ndarray,
    interacted: np.ndarray,
    num_items: int,
    rng: np.random.Generator,
    k: int = 10,
    candidates: int = 100,
) -> float:
    """The share of held-out items ranked in the top ``k`` of their candidate list.

    Each held-out ``(user, item)`` is ranked among ``candidates - 1`` items drawn uniformly
    from those the user never interacted with. Ties count against the held-out item, so
    a constant score gets no credit.

    Parameters
    ----------
    score : callable
        ``(M, 2)`` int64 ``(user, item)`` pairs -> ``(M,)`` scores, higher is better.
    held_out : ``(U, 2)`` int array
        One held-out interaction per row.
    interacted : ``(I, 2)`` int array
        Every known interaction (training and held out): never drawn as a candidate.
    num_items : int
    rng : numpy.random.Generator
    k, candidates : int
        ``1 <= k <= candidates``.

    Returns
    -------
    float
        Hit rate in [0, 1].
    """
    if not 1 <= k <= candidates:
        raise ValueError(f"hit_rate_at_k: need 1 <= k <= candidates, got k={k}, {candidates}")
    held_out = np.asarray(held_out, np.int64)
    codes = np.unique(_codes(interacted[:, 0], interacted[:, 1], num_items))
    users = np.repeat(held_out[:, 0], candidates - 1)
    others = _items_not_interacted(users, codes, num_items, rng)
    pairs = np.concatenate([held_out, np.stack([users, others], axis=1)])
    scores = np.asarray(score(pairs), dtype=np.float64)
    held_out_scores = scores[: len(held_out)]
    other_scores = scores[len(held_out) :].reshape(len(held_out), candidates - 1)
    ranked_above = (other_scores >= held_out_scores[:, None]).sum(axis=1)
    return float(np.mean(ranked_above < k))
