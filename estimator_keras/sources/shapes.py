"""A generated segmentation set: coloured shapes on a noisy background.

:class:`ShapesSource` needs no files: every example is drawn from its
(seed, index) pair, which makes it a dataset of any size for tests and
benchmarks.
"""

import functools

import numpy as np

from estimator_keras.errors import UsageError
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources.base import Source, as_indices

SHAPES_CLASSES = ("background", "circle", "rectangle", "triangle")
"""Class names of :class:`ShapesSource` masks; the index is the pixel value."""

# Mixed into every example's seed so these streams differ from other users of
# the same (seed, index) pair.
_SHAPES_SALT = 0x5EA5_0001


class ShapesSource(Source):
    """A generated segmentation set: 1-3 coloured shapes on a noisy background.

    Each example depends only on (seed, index), so any read order or batching
    gives the same example for the same index. Features: ``image`` uint8
    (S, S, 3) and ``mask`` uint8 (S, S, 1), both ``raw``; mask values index
    :data:`SHAPES_CLASSES` (0 background, 1 circle, 2 rectangle, 3 triangle;
    later shapes overwrite earlier ones).

    Args:
      num_examples: how many examples the source holds.
      image_size: S, at least 16.
      seed: non-negative int selecting the set.

    Example::

        source = ShapesSource(1000, image_size=64, seed=0)
        image, mask = source.example(7)
    """

    _TRANSIENT = ("_grid",)

    def __init__(self, num_examples, image_size=64, seed=0):
        for name, value, low in (("num_examples", num_examples, 0),
                                 ("image_size", image_size, 16), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise UsageError(f"ShapesSource: {name} must be an int >= {low}; "
                                 f"got {value!r}.")
        self._num_examples = int(num_examples)
        self.image_size = int(image_size)
        self.seed = int(seed)
        s = self.image_size
        self.features = {
            "image": FeatureSpec("image", "uint8", (s, s, 3), "raw"),
            "mask": FeatureSpec("mask", "uint8", (s, s, 1), "raw"),
        }

    @functools.cached_property
    def _grid(self):
        # Pixel centres, so shapes are symmetric about their centre.
        coords = np.arange(self.image_size, dtype=np.float32) + 0.5
        yy, xx = np.meshgrid(coords, coords, indexing="ij")
        return yy, xx

    def example(self, index):
        """(image, mask) of example ``index``: uint8 (S, S, 3) and (S, S, 1)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"ShapesSource: index {index} is out of range; the source "
                             f"holds {len(self)} examples.")
        s = float(self.image_size)
        yy, xx = self._grid
        rng = np.random.default_rng([_SHAPES_SALT, self.seed, index])
        background = rng.integers(0, 256, 3)
        canvas = np.empty((self.image_size, self.image_size, 3), dtype=np.int16)
        canvas[...] = background
        mask = np.zeros((self.image_size, self.image_size), dtype=np.uint8)
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(1, 4))
            colour = rng.integers(0, 256, 3)
            for _ in range(8):
                # Keep shapes visible against the background.
                if np.abs(colour - background).sum() >= 160:
                    break
                colour = rng.integers(0, 256, 3)
            if kind == 1:
                r = rng.uniform(0.08 * s, 0.22 * s)
                cy, cx = rng.uniform(r, s - r, 2)
                inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
            elif kind == 2:
                hh, hw = rng.uniform(0.07 * s, 0.22 * s, 2)
                cy = rng.uniform(hh, s - hh)
                cx = rng.uniform(hw, s - hw)
                inside = (np.abs(yy - cy) <= hh) & (np.abs(xx - cx) <= hw)
            else:
                r = rng.uniform(0.12 * s, 0.28 * s)
                cy, cx = rng.uniform(r, s - r, 2)
                angles = (rng.uniform(0, 2 * np.pi) + np.arange(3) * (2 * np.pi / 3)
                          + rng.uniform(-0.3, 0.3, 3))
                vy, vx = cy + r * np.sin(angles), cx + r * np.cos(angles)
                # Half-plane tests: inside when on the same side of all edges.
                # Multiplying by the orientation makes "same side" mean >= 0.
                orient = np.sign((vx[1] - vx[0]) * (vy[2] - vy[0])
                                 - (vy[1] - vy[0]) * (vx[2] - vx[0])) or 1.0
                inside = np.ones_like(mask, dtype=bool)
                for a, b in ((0, 1), (1, 2), (2, 0)):
                    edge = ((vx[b] - vx[a]) * (yy - vy[a]) - (vy[b] - vy[a]) * (xx - vx[a]))
                    inside &= edge * orient >= 0
            canvas[inside] = colour
            mask[inside] = kind
        canvas += rng.integers(-20, 21, canvas.shape, dtype=np.int16)
        image = np.clip(canvas, 0, 255).astype(np.uint8)
        return image, mask[..., None]

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        s = self.image_size
        images = np.empty((len(idx), s, s, 3), dtype=np.uint8)
        masks = np.empty((len(idx), s, s, 1), dtype=np.uint8)
        for k, i in enumerate(idx):
            images[k], masks[k] = self.example(i)
        return {"image": images, "mask": masks}
