"""PNG and JPEG files: header probing, and the bytes stored for each image.

Headers are parsed by hand (:func:`probe_all`), so listing a folder of images
learns every file's format, size and channels without decoding pixels.
:func:`choose_encoding` decides which files can be stored byte for byte and
which must be re-encoded; :func:`image_bytes` and :func:`mask_bytes` produce
the stored bytes, decoding with TensorFlow only where needed.
"""

import os
import struct

import numpy as np
import tensorflow as tf

from estimator_keras import io
from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources.base import preview

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: None, 4: 2, 6: 4}
# A missing or unreadable remote file fails with TF's errors, a local one with OSError.
_READ_ERRORS = (OSError, tf.errors.OpError)


class _BadImage(Exception):
    """Raised by the header probe; turned into a DataError naming the file."""


class ImageInfo:
    """What an image file's header says, read without decoding the pixels."""

    def __init__(self, fmt, height, width, channels, depth=8, palette=False):
        self.fmt, self.height, self.width = fmt, height, width
        # Channels a plain decode gives, or None when TF would convert
        # (palette PNGs, CMYK JPEGs): such files are always re-encoded.
        self.channels = channels
        self.depth = depth  # bits per sample
        self.palette = palette

    @property
    def eight_bit(self):
        return self.depth == 8


def _probe_image(path):
    """Reads the PNG or JPEG header of ``path``: format, size, channels."""
    try:
        with io.open_file(path, "rb") as f:
            head = f.read(32)
            if head.startswith(_PNG_SIGNATURE):
                if len(head) < 26 or head[12:16] != b"IHDR":
                    raise _BadImage("its PNG header is incomplete")
                width, height = struct.unpack(">II", head[16:24])
                depth, color = head[24], head[25]
                if color not in _PNG_CHANNELS or width == 0 or height == 0:
                    raise _BadImage(f"its PNG header is invalid (colour type {color}, "
                                    f"size {width}x{height})")
                return ImageInfo("png", height, width, _PNG_CHANNELS[color],
                                 depth, palette=color == 3)
            if head[:2] == b"\xff\xd8":
                return _probe_jpeg(f)
            raise _BadImage("it is neither a PNG nor a JPEG (unrecognised first bytes)")
    except _READ_ERRORS as e:
        raise _BadImage(f"it cannot be read ({e})") from e


def _probe_jpeg(f):
    # Walk the marker segments up to the frame header (SOFn), skipping EXIF
    # and other application segments by their length fields.
    pos = 2
    while True:
        f.seek(pos)
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            raise _BadImage("its JPEG markers are broken before the frame header")
        code = marker[1]
        pos += 2
        if code == 0xFF:  # fill byte
            pos -= 1
            continue
        if code in (0x01, 0xD8) or 0xD0 <= code <= 0xD7:
            continue  # markers without a length
        if code in (0xD9, 0xDA):
            raise _BadImage("it has no JPEG frame header before its image data")
        length = f.read(2)
        if len(length) < 2:
            raise _BadImage("it is truncated inside its JPEG header")
        seglen = struct.unpack(">H", length)[0]
        if seglen < 2:
            raise _BadImage("its JPEG header has an invalid segment length")
        if 0xC0 <= code <= 0xCF and code not in (0xC4, 0xC8, 0xCC):
            frame = f.read(6)
            if len(frame) < 6:
                raise _BadImage("it is truncated inside its JPEG frame header")
            _, height, width, comps = struct.unpack(">BHHB", frame)
            if height == 0 or width == 0:
                raise _BadImage(f"its JPEG frame header gives size {width}x{height}")
            return ImageInfo("jpeg", height, width, comps if comps in (1, 3) else None)
        pos += seglen


def probe_all(paths):
    """The :class:`ImageInfo` of every file; DataError naming a bad one."""
    infos = []
    for path in paths:
        try:
            infos.append(_probe_image(path))
        except _BadImage as e:
            raise DataError(f"image {path} is unreadable or corrupt: {e}. Remove or "
                            f"replace it.") from e
    return infos


def list_images(directory):
    """Sorted image file names (by extension) in ``directory``, and the others."""
    images, others = [], []
    for name in io.listdir(directory):
        if name.startswith("."):
            continue
        if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
            images.append(name)
        elif not io.isdir(io.join(directory, name)):
            others.append(name)
    return images, others


def native_ok(info, channels):
    """True when the file's bytes decode, unconverted, to uint8 with ``channels``."""
    return info.channels == channels and info.eight_bit


def choose_encoding(infos, channels, size=None):
    """Picks the feature's encoding and which files must be re-encoded.

    Files are stored byte for byte when they all share one format and decode
    to the wanted channels (and size). Otherwise the feature becomes PNG and
    only the files that are not already such PNGs are decoded and re-encoded:
    PNG is lossless, whereas re-encoding to JPEG would degrade every image a
    second time.
    """
    def fits(info):
        return native_ok(info, channels) and (
            size is None or (info.height, info.width) == size)

    formats = {info.fmt for info in infos}
    if size is None and len(formats) == 1 and all(fits(i) for i in infos):
        return formats.pop(), np.zeros(len(infos), dtype=bool)
    reencode = np.array([not (i.fmt == "png" and fits(i)) for i in infos], dtype=bool)
    return "png", reencode


def check_same_size(paths, infos, hint):
    """DataError listing the files whose size differs from the first one's."""
    first = infos[0]
    odd = [f"{p} ({i.height}x{i.width})" for p, i in zip(paths, infos)
           if (i.height, i.width) != (first.height, first.width)]
    if odd:
        raise DataError(
            f"images must all have the same size; {paths[0]} is {first.height}x"
            f"{first.width} (height x width) but {len(odd)} differ: {preview(odd, 5)}. "
            f"{hint}")


def image_bytes(path, reencode, channels, size, verify, expected):
    """The stored bytes of one image: the file itself, or a PNG re-encoding.

    With ``verify`` the file is decoded even when stored as is, so a corrupt
    image fails here, naming the file, instead of in the training input
    pipeline.
    """
    data = io.read_bytes(path)
    if not (reencode or verify):
        return data
    try:
        image = tf.io.decode_image(data, channels=channels if reencode else 0,
                                   expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        raise DataError(f"image {path} is unreadable or corrupt: decoding failed "
                        f"({str(e).splitlines()[0][-200:]}). Remove or replace it.") from e
    if reencode:
        if size is not None and tuple(image.shape[:2]) != tuple(size):
            resized = tf.image.resize(image, size, method="bilinear", antialias=True)
            image = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
        data = tf.io.encode_png(image).numpy()
    elif tuple(image.shape) != tuple(expected):
        raise DataError(f"image {path} decodes to shape {tuple(image.shape)}, but its "
                        f"header promised {tuple(expected)}; the file is corrupt.")
    return data


def mask_bytes(path, reencode, depth, verify, expected):
    """The stored bytes of one segmentation mask: an 8-bit grayscale PNG.

    A mask that is not one already (RGB with equal channels, 16-bit, or 1, 2
    or 4 bits per sample) is decoded and re-encoded keeping its class ids.
    """
    if not reencode:
        return image_bytes(path, False, 1, None, verify, expected)
    data = io.read_bytes(path)
    try:
        # 16-bit files decode as uint16 so their ids stay exact (asking
        # for uint8 would rescale them).
        mask = tf.io.decode_png(
            data, channels=0, dtype=tf.uint16 if depth == 16 else tf.uint8).numpy()
    except tf.errors.InvalidArgumentError as e:
        raise DataError(f"mask {path} is unreadable or corrupt: decoding failed "
                        f"({str(e).splitlines()[0][-200:]}). Remove or replace "
                        f"it.") from e
    if depth < 8:
        # libpng stretches 1/2/4-bit samples to 0..255 (1 -> 255 for a
        # binary mask); undo it to get the stored class ids back.
        mask = mask // (255 // (2 ** depth - 1))
    if mask.shape[-1] >= 3 and not (
            np.array_equal(mask[..., 0], mask[..., 1])
            and np.array_equal(mask[..., 0], mask[..., 2])):
        raise DataError(f"mask {path} is a colour image; masks must be grayscale "
                        f"with class ids as pixel values.")
    ids = mask[..., :1]  # drops alpha and the copies of a gray-as-RGB mask
    if ids.max(initial=0) > 255:
        raise DataError(f"mask {path} holds class id {int(ids.max())}; masks are "
                        f"stored as uint8, so ids must be at most 255.")
    return tf.io.encode_png(ids.astype(np.uint8)).numpy()


def image_size_arg(image_size):
    """``image_size`` as None or (height, width); UsageError when malformed."""
    if image_size is None:
        return None
    size = (image_size, image_size) if np.isscalar(image_size) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, (int, np.integer)) and s > 0 for s in size):
        raise UsageError(f"image_size must be a positive int or (height, width); "
                         f"got {image_size!r}.")
    return tuple(int(s) for s in size)


def channels_arg(channels):
    """``channels`` when it is 1 or 3; UsageError otherwise."""
    if channels not in (1, 3):
        raise UsageError(f"channels must be 1 (grayscale) or 3 (RGB); got {channels!r}.")
    return channels
