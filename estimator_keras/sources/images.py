"""Image files: header probing, decoding, and the bytes or pixels stored.

Headers of PNG, JPEG, GIF and BMP files are parsed by hand
(:func:`probe_stream`), so listing a folder of images learns every file's
format, size and channels without decoding pixels; :func:`inspect_image`
also decodes one fully, to tell a readable file from a corrupt one.
:func:`choose_encoding` and :func:`plan_storage` decide whether files are
stored byte for byte, re-encoded as PNG, or decoded to raw pixels;
:func:`image_bytes`, :func:`decode_pixels` and :func:`mask_ids` produce what
is stored.

Files stored as they are never need TensorFlow: they are checked by
decoding them with TensorFlow where it is installed, else with Pillow (the
stored bytes are the file's either way). What is stored decoded or
re-encoded (resized images, raw pixels, PNG re-encodings) is TensorFlow's
decoding, resizing and PNG encoding, so that a dataset has the same bytes
wherever it is prepared: without TensorFlow those steps raise UsageError
naming it (:func:`check_storage` and :func:`pixels_need_tensorflow` tell
before anything is written).
"""

import functools
import io as _bytes_io
import os
import struct
import zlib
from typing import NamedTuple

import numpy as np

from estimator_keras import io, tf_optional
from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources.base import preview

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
"""File name endings read as images (compared in lower case)."""

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: None, 4: 2, 6: 4}
# The bit depths the PNG standard allows for each colour type.
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# What is stored without TensorFlow.
STORED_AS_THEY_ARE = ("Without it, images that are all PNG or all JPEG, of one size and "
                      "with the channels wanted, are stored as they are, and so are 8-bit "
                      "grey PNG masks.")
# Pillow's modes of the images it decodes without converting them, by channels.
_PILLOW_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3,
                    "RGBA": 4}


def _read_errors():
    # A missing or unreadable remote file fails with TF's errors, a local one with OSError.
    tf = tf_optional.tensorflow()
    return (OSError, tf.errors.OpError) if tf else (OSError,)


def _decode_errors(tf):
    return (tf.errors.OpError, ValueError)


class BadImage(Exception):
    """A file or value that is not a readable image; the message says why."""


class ImageInfo(NamedTuple):
    """What an image's header says, read without decoding the pixels.

    ``channels`` is what a plain decode gives, or None when TensorFlow would
    have to convert (palette PNGs, CMYK JPEGs, 8-bit BMPs): such files are
    always re-encoded. ``depth`` is bits per sample; ``grey`` tells grey
    images from colour ones for the majority vote on channels.
    """

    fmt: str
    height: int
    width: int
    channels: int
    depth: int = 8
    palette: bool = False
    grey: bool = False

    @property
    def eight_bit(self):
        return self.depth == 8

    @property
    def size(self):
        return (self.height, self.width)


def probe_stream(f):
    """The :class:`ImageInfo` of the image in the seekable binary file ``f``.

    Raises:
      BadImage: the header is not one of a PNG, JPEG, GIF or BMP, or is
        broken.
    """
    head = f.read(32)
    if head.startswith(_PNG_SIGNATURE):
        if len(head) < 26 or head[12:16] != b"IHDR":
            raise BadImage("its PNG header is incomplete")
        width, height = struct.unpack(">II", head[16:24])
        depth, color = head[24], head[25]
        if (color not in _PNG_CHANNELS or depth not in _PNG_DEPTHS[color] or width == 0
                or height == 0):
            raise BadImage(f"its PNG header is invalid (colour type {color}, bit depth "
                           f"{depth}, size {width}x{height})")
        return ImageInfo("png", height, width, _PNG_CHANNELS[color], depth,
                         palette=color == 3, grey=color in (0, 4))
    if head[:2] == b"\xff\xd8":
        return _probe_jpeg(f)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _probe_gif(f, head)
    if head[:2] == b"BM":
        return _probe_bmp(f, head)
    raise BadImage("it is not a PNG, JPEG, GIF or BMP image (unrecognised first bytes)")


def looks_like_image(data):
    """True when ``data`` starts like a PNG, JPEG, GIF or BMP file."""
    return (data[:8] == _PNG_SIGNATURE or data[:2] in (b"\xff\xd8", b"BM")
            or data[:6] in (b"GIF87a", b"GIF89a"))


def probe_bytes(data):
    """The :class:`ImageInfo` of an encoded image held in memory."""
    return probe_stream(_bytes_io.BytesIO(data))


def _probe_jpeg(f):
    # Walk the marker segments up to the frame header (SOFn), skipping EXIF
    # and other application segments by their length fields.
    pos = 2
    while True:
        f.seek(pos)
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            raise BadImage("its JPEG markers are broken before the frame header")
        code = marker[1]
        pos += 2
        if code == 0xFF:  # fill byte
            pos -= 1
            continue
        if code in (0x01, 0xD8) or 0xD0 <= code <= 0xD7:
            continue  # markers without a length
        if code in (0xD9, 0xDA):
            raise BadImage("it has no JPEG frame header before its image data")
        length = f.read(2)
        if len(length) < 2:
            raise BadImage("it is truncated inside its JPEG header")
        seglen = struct.unpack(">H", length)[0]
        if seglen < 2:
            raise BadImage("its JPEG header has an invalid segment length")
        if 0xC0 <= code <= 0xCF and code not in (0xC4, 0xC8, 0xCC):
            frame = f.read(6)
            if len(frame) < 6:
                raise BadImage("it is truncated inside its JPEG frame header")
            _, height, width, comps = struct.unpack(">BHHB", frame)
            if height == 0 or width == 0:
                raise BadImage(f"its JPEG frame header gives size {width}x{height}")
            return ImageInfo("jpeg", height, width, comps if comps in (1, 3) else None,
                             grey=comps == 1)
        pos += seglen


def _probe_gif(f, head):
    # TensorFlow decodes the logical screen (the first frame) as RGB.
    if len(head) < 13:
        raise BadImage("its GIF header is incomplete")
    width, height, packed = struct.unpack("<HHB", head[6:11])
    if width == 0 or height == 0:
        raise BadImage(f"its GIF header gives size {width}x{height}")
    grey = False
    if packed & 0x80:
        f.seek(13)
        table = f.read(3 * 2 ** ((packed & 7) + 1))
        colours = np.frombuffer(table[:len(table) // 3 * 3], np.uint8).reshape(-1, 3)
        grey = bool(len(colours)) and bool((colours == colours[:, :1]).all())
    return ImageInfo("gif", height, width, 3, palette=True, grey=grey)


def _probe_bmp(f, head):
    f.seek(0)
    header = f.read(54)
    if len(header) < 30:
        raise BadImage("its BMP header is incomplete")
    dib_size = struct.unpack("<I", header[14:18])[0]
    if dib_size < 40 or len(header) < 54:
        raise BadImage(f"its BMP header is of an old kind (size {dib_size}) that "
                       f"TensorFlow cannot decode")
    width, height, _, bpp, compression = struct.unpack("<iiHHI", header[18:34])
    height = abs(height)  # negative: rows stored top-down
    if width <= 0 or height == 0:
        raise BadImage(f"its BMP header gives size {width}x{height}")
    if compression not in (0, 3):
        raise BadImage(f"it is a compressed BMP (compression {compression}), which "
                       f"TensorFlow cannot decode")
    if bpp in (24, 32):
        return ImageInfo("bmp", height, width, bpp // 8)
    if bpp == 8:
        palette = _bmp_palette(f, dib_size, header)
        return ImageInfo("bmp", height, width, None, palette=True,
                         grey=palette.shape[1] == 1)
    raise BadImage(f"it is a BMP with {bpp} bits per pixel; TensorFlow decodes "
                   f"8, 24 and 32")


def _bmp_palette(f, dib_size, header):
    """An 8-bit BMP's colour table as (256, 1) grey levels or (256, 3) RGB."""
    used = struct.unpack("<I", header[46:50])[0] or 256
    f.seek(14 + dib_size)
    table = np.frombuffer(f.read(4 * min(used, 256)), np.uint8)
    rgb = table[:len(table) // 4 * 4].reshape(-1, 4)[:, 2::-1]
    full = np.zeros((256, 3), np.uint8)
    full[:len(rgb)] = rgb
    return full[:, :1] if (full == full[:, :1]).all() else full


def _probe_image(path):
    """Reads the header of the image file ``path``."""
    try:
        with io.open_file(path, "rb") as f:
            return probe_stream(f)
    except _read_errors() as e:
        raise BadImage(f"it cannot be read ({e})") from e


def probe_all(paths):
    """The :class:`ImageInfo` of every file; DataError naming a bad one."""
    infos = []
    for path in paths:
        try:
            infos.append(_probe_image(path))
        except BadImage as e:
            raise DataError(f"image {path} is unreadable or corrupt: {e}. Remove or "
                            f"replace it.") from e
    return infos


def _decode_error(e):
    return str(e).splitlines()[0].split(" [Op:")[0].split("}} ")[-1][-200:]


@functools.lru_cache(maxsize=None)
def _pillow():
    """Pillow's Image module, imported on first use."""
    try:
        from PIL import Image  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise UsageError(
            f"checking images without TensorFlow needs Pillow, which is not installed: run "
            f"`pip install Pillow`, or install TensorFlow: {tf_optional.INSTALL}.") from e
    return Image


def _png_as_libpng_reads_it(data):
    """A PNG's bytes as libpng (TensorFlow's decoder) accepts them: BadImage
    when a critical chunk's CRC does not match or the file ends before its
    IEND chunk; ancillary chunks whose CRC does not match are dropped, as
    libpng drops them."""
    pos, kept, dropped = len(_PNG_SIGNATURE), [data[:len(_PNG_SIGNATURE)]], False
    while True:
        length = struct.unpack(">I", data[pos:pos + 4])[0] if pos + 4 <= len(data) else 0
        end = pos + 12 + length
        if end > len(data):
            raise BadImage("decoding failed: the file ends before its IEND chunk (it is "
                           "truncated)")
        kind = data[pos + 4:pos + 8]
        if not kind.isalpha():
            raise BadImage(f"decoding failed: its chunk type {kind!r} is not 4 letters (the "
                           f"file is damaged)")
        if zlib.crc32(data[pos + 4:end - 4]) == struct.unpack(">I", data[end - 4:end])[0]:
            kept.append(data[pos:end])
        elif kind[0] & 0x20:  # a lower-case first letter: an ancillary chunk
            dropped = True
        else:
            raise BadImage(f"decoding failed: the CRC of its {kind.decode('latin-1')!r} "
                           f"chunk does not match (the file is damaged)")
        pos = end
        if kind == b"IEND":
            return b"".join(kept) if dropped else data


def _pillow_open(data):
    """The image of encoded bytes (a PNG's checked by
    :func:`_png_as_libpng_reads_it` already), decoded whole by Pillow;
    BadImage saying why when that fails."""
    image_module = _pillow()
    try:
        image = image_module.open(_bytes_io.BytesIO(data))
        image.load()
    # Pillow's decoders fail with OSError, SyntaxError, ValueError, EOFError...
    except Exception as e:  # pylint: disable=broad-except
        raise BadImage(f"decoding failed: {type(e).__name__}: {str(e)[:200]}") from e
    return image


def _kind(info):
    """How :class:`ImageInfo` describes an image in a sentence."""
    if info.palette and info.fmt == "png":
        return "palette PNG"
    if not info.eight_bit:
        return f"{info.depth}-bit {info.fmt.upper()}"
    if info.fmt in ("png", "jpeg"):
        return (f"{info.fmt.upper()} ({info.channels} channels)" if info.channels
                else f"{info.fmt.upper()} (neither grey nor RGB)")
    return info.fmt.upper()


def decoded_shape(data):
    """(height, width, channels) of encoded bytes, decoded whole as
    TensorFlow's ``decode_image(channels=0)`` does; BadImage saying why
    decoding fails.

    Without TensorFlow Pillow decodes the images that can be stored as they
    are (8-bit grey or RGB PNG and JPEG files), after checking the CRCs of a
    PNG's chunks as libpng does. Any other image is re-encoded by
    TensorFlow, unless TensorFlow finds it unreadable: only TensorFlow can
    tell, so it is a UsageError naming TensorFlow.
    """
    tf = tf_optional.tensorflow()
    if tf is None:
        if data[:len(_PNG_SIGNATURE)] == _PNG_SIGNATURE:
            # A damaged chunk fails here as in libpng, whatever the image is.
            data = _png_as_libpng_reads_it(data)
        info = probe_bytes(data)
        if not (info.fmt in ("png", "jpeg") and info.channels in (1, 3) and info.eight_bit):
            tf_optional.require(f"checking and re-encoding {_kind(info)} images",
                                STORED_AS_THEY_ARE)
        image = _pillow_open(data)
        return (image.height, image.width, _PILLOW_CHANNELS.get(image.mode))
    try:
        return tuple(tf.io.decode_image(data, channels=0, expand_animations=False).shape)
    except _decode_errors(tf) as e:
        raise BadImage(f"decoding failed: {_decode_error(e)}") from e


def inspect_image(data):
    """The :class:`ImageInfo` of encoded bytes, checked by decoding them fully.

    Raises:
      BadImage: the header is broken, decoding fails, or the pixels do not
        match the header (a truncated or damaged file).
    """
    info = probe_bytes(data)
    shape = decoded_shape(data)
    if tuple(shape[:2]) != info.size:
        raise BadImage(f"it decodes to {shape[0]}x{shape[1]} but its "
                       f"header says {info.height}x{info.width}")
    return info


def check_storage(encoding, reencode, names, what="images"):
    """UsageError naming the first file when storing ``names`` as planned
    (``encoding``, and the files whose ``reencode`` flag is set) takes
    TensorFlow and it is not installed: checked before anything is written."""
    reencode = np.asarray(reencode, dtype=bool)
    if encoding != "raw" and not reencode.any():
        return
    if encoding == "raw":
        step = f"storing {what} as raw pixels, decoded and resized to one size"
    else:
        step = (f"re-encoding {int(reencode.sum())} of the {what} as PNG (the first: "
                f"{names[int(np.flatnonzero(reencode)[0])]})")
    tf_optional.require(step, STORED_AS_THEY_ARE)


def pixels_need_tensorflow(infos, channels, size):
    """Whether images of these :class:`ImageInfo` (raw pixels included) take
    TensorFlow to become uint8 ``size + (channels,)`` pixels: a resize, or
    colour made grey. Dropping alpha and repeating grey need none."""
    return any(tuple(i.size) != tuple(size) or (channels == 1 and (i.channels or 3) >= 3)
               for i in infos)


def to_channels(image, channels):
    """uint8 pixels (h, w, c) converted to 1 (grey) or 3 (RGB) channels;
    an alpha channel is dropped."""
    have = image.shape[-1]
    if have in (2, 4):
        image = image[..., :have - 1]
    if image.shape[-1] == channels:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=-1)
    tf = tf_optional.require("converting colour images to grey", STORED_AS_THEY_ARE)
    return tf.image.rgb_to_grayscale(image).numpy()


def resize_pixels(image, size, nearest=False):
    """uint8 pixels resized to ``size`` (height, width); unchanged when they
    already have it. ``nearest`` keeps values exact (class ids of masks)."""
    if size is None or tuple(image.shape[:2]) == tuple(size):
        return image
    tf = tf_optional.require(f"resizing images to {size[0]}x{size[1]}", STORED_AS_THEY_ARE)
    if nearest:
        return tf.image.resize(image, size, method="nearest").numpy().astype(np.uint8)
    resized = tf.image.resize(image, size, method="bilinear", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8).numpy()


def decode_pixels(data, channels, size=None, name="image"):
    """uint8 pixels (height, width, channels) of encoded bytes, resized to
    ``size`` when given; DataError naming ``name`` when decoding fails."""
    tf = tf_optional.require(f"decoding {name} to pixels", STORED_AS_THEY_ARE)
    try:
        if data[:2] == b"BM" or data[:6] in (b"GIF87a", b"GIF89a"):
            # TensorFlow decodes these with their own channels only, and
            # gives an 8-bit BMP's palette indices rather than its colours.
            image = tf.io.decode_image(data, channels=0, expand_animations=False).numpy()
            if data[:2] == b"BM" and image.shape[-1] == 1:
                f = _bytes_io.BytesIO(data)
                header = f.read(54)
                image = _bmp_palette(f, struct.unpack("<I", header[14:18])[0],
                                     header)[image[..., 0]]
            image = to_channels(image, channels)
        else:
            image = tf.io.decode_image(data, channels=channels,
                                       expand_animations=False).numpy()
    except _decode_errors(tf) as e:
        raise DataError(f"{name} is unreadable or corrupt: decoding failed "
                        f"({_decode_error(e)}). Remove or replace it.") from e
    return resize_pixels(image, size)


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
    """True when the file's bytes can be stored as they are: a PNG or JPEG
    that decodes, unconverted, to uint8 with ``channels``."""
    return info.fmt in ("png", "jpeg") and info.channels == channels and info.eight_bit


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


def plan_storage(infos, channels, size):
    """(encoding, re-encode flags) for images that end up ``size``.

    When every image already has ``size`` the choice is
    :func:`choose_encoding`'s (bytes kept where they can be); when some must
    be resized, every image is decoded and stored as raw pixels, which saves
    re-encoding now and decoding in every epoch.
    """
    if all(i.size == tuple(size) for i in infos):
        return choose_encoding(infos, channels)
    return "raw", np.ones(len(infos), dtype=bool)


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
    if reencode:
        return encode_png(decode_pixels(data, channels, size, f"image {path}"), f"image {path}")
    if verify:
        try:
            shape = decoded_shape(data)
        except BadImage as e:
            raise DataError(f"image {path} is unreadable or corrupt: {e}. Remove or "
                            f"replace it.") from e
        if tuple(shape) != tuple(expected):
            raise DataError(f"image {path} decodes to shape {tuple(shape)}, but "
                            f"its header promised {tuple(expected)}; the file is corrupt.")
    return data


def encode_png(pixels, name):
    """uint8 pixels as TensorFlow's PNG encoding (UsageError without it)."""
    tf = tf_optional.require(f"re-encoding {name} as PNG", STORED_AS_THEY_ARE)
    return tf.io.encode_png(pixels).numpy()


def mask_ids(data, depth, name):
    """The class ids of an encoded PNG mask, as uint8 (height, width, 1).

    Masks of 16 bits, of 1, 2 or 4 bits per sample, and grey masks saved as
    RGB all give their ids back; a colour mask is a DataError naming ``name``.
    """
    tf = tf_optional.tensorflow()
    try:
        if tf is None:
            mask = _pillow_mask(data, depth, name)
        else:
            # 16-bit files decode as uint16 so their ids stay exact (asking
            # for uint8 would rescale them).
            mask = tf.io.decode_png(
                data, channels=0, dtype=tf.uint16 if depth == 16 else tf.uint8).numpy()
    except (BadImage,) + (_decode_errors(tf) if tf else ()) as e:
        message = str(e) if isinstance(e, BadImage) else f"decoding failed ({_decode_error(e)})"
        raise DataError(f"mask {name} is unreadable or corrupt: {message}. Remove or "
                        f"replace it.") from e
    if depth < 8:
        # libpng stretches 1/2/4-bit samples to 0..255 (1 -> 255 for a
        # binary mask); undo it to get the stored class ids back.
        mask = mask // (255 // (2 ** depth - 1))
    if mask.shape[-1] >= 3 and not (
            np.array_equal(mask[..., 0], mask[..., 1])
            and np.array_equal(mask[..., 0], mask[..., 2])):
        raise DataError(f"mask {name} is a colour image; masks must be grayscale "
                        f"with class ids as pixel values.")
    ids = mask[..., :1]  # drops alpha and the copies of a gray-as-RGB mask
    if ids.max(initial=0) > 255:
        raise DataError(f"mask {name} holds class id {int(ids.max())}; masks are "
                        f"stored as uint8, so ids must be at most 255.")
    return ids.astype(np.uint8)


def mask_bytes(path, reencode, depth, verify, expected):
    """The stored bytes of one segmentation mask: an 8-bit grayscale PNG.

    A mask that is not one already (RGB with equal channels, 16-bit, or 1, 2
    or 4 bits per sample) is decoded and re-encoded keeping its class ids.
    """
    if not reencode:
        return image_bytes(path, False, 1, None, verify, expected)
    return encode_png(mask_ids(io.read_bytes(path), depth, path), f"mask {path}")


def _pillow_mask(data, depth, name):
    """A PNG mask's samples as TensorFlow's ``decode_png(channels=0)`` gives
    them: (height, width, channels), samples of 1, 2 or 4 bits stretched to
    0..255, 16-bit grey as uint16. Pillow narrows other 16-bit images to 8
    bits, so those need TensorFlow."""
    image = _pillow_open(_png_as_libpng_reads_it(data) if data[:8] == _PNG_SIGNATURE else data)
    if image.mode == "1":
        image = image.convert("L")
    if image.mode not in _PILLOW_CHANNELS or (depth == 16 and image.mode not in (
            "I", "I;16", "I;16B")):
        tf_optional.require(f"reading the {depth}-bit {image.mode} mask {name}",
                            STORED_AS_THEY_ARE)
    mask = np.asarray(image)
    if mask.dtype != np.uint8:
        mask = mask.astype(np.uint16)
    return mask.reshape(mask.shape[:2] + (-1,))


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
