"""Small real PDF and HTML files written by the tests themselves (no binary fixtures)."""
from __future__ import annotations

import zlib


def pdf_bytes(pages: list[list[str]], title: str = "", to_unicode: dict[str, str] | None = None) -> bytes:
    """A valid PDF 1.4: one Helvetica text line per string, one page per list, optional Info title. ``to_unicode``
    maps character codes of the lines to the text a reader extracts for them (the font's ToUnicode CMap), as the
    PDFs of word processors map their glyphs."""
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding%s >>"
               % (b" /ToUnicode %d 0 R" % (4 + 2 * n) if to_unicode else b"")]
    for i, lines in enumerate(pages):
        text = " T* ".join(f"({esc(line)}) Tj" for line in lines)
        stream = f"BT /F1 11 Tf 14 TL 50 740 Td {text} ET".encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    if to_unicode:
        objects.append(_stream(_cmap(to_unicode)))
    if title:
        objects.append(f"<< /Title ({esc(title)}) >>".encode("latin-1"))
    return _pdf(objects, info=bool(title))


def _cmap(to_unicode: dict[str, str]) -> bytes:
    pairs = "".join(f"<{ord(code):02X}> <{ord(char):04X}>\n" for code, char in to_unicode.items())
    return ("/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /Custom-UCS def /CMapType 2 def\n"
            f"1 begincodespacerange <00> <FF> endcodespacerange\n{len(to_unicode)} beginbfchar\n{pairs}endbfchar\n"
            "endcmap CMapName currentdict /CMap defineresource pop end end").encode()


def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def _pdf(objects: list[bytes], info: bool = False) -> bytes:
    """The PDF file of ``objects`` (numbered from 1; the first is the catalog, the last the Info if ``info``)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    info_ref = f" /Info {len(objects)} 0 R" if info else ""
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info_ref} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


HTML_PAGE = """<!doctype html>
<html><head><title>Harbour Aquarium</title><style>p { color: red }</style>
<script>var hidden = "script text must not be indexed";</script></head>
<body>
<nav><a href="/">Home</a> <a href="/visit">Visit</a></nav>
<p>The Harbour Aquarium is a small public aquarium on the old pier.</p>
<h2>Feeding times</h2>
<p>The sea otters are fed at <b>11:30</b> and again at 15:00 every day.</p>
<ul><li>Penguins are fed at 14:00 on weekdays.</li><li><p>Rays are fed on Sundays only.</p></li></ul>
<h2>Shark tunnel</h2>
<p>The shark tunnel is 40 metres long and holds two million litres of seawater.</p>
</body></html>
"""


def pdf_bomb_bytes(inflated_mb: int) -> bytes:
    """A one-page PDF whose Flate content stream inflates to ``inflated_mb`` MB of tiny text operations
    (about 1,000:1: 20 MB inflated is a 31 kB file; each operation costs the parser a text object)."""
    deflate = zlib.compressobj(9)
    ops = b"(a) Tj " * (1 << 17)
    stream = deflate.compress(b"BT /F1 1 Tf ")
    stream += b"".join(deflate.compress(ops) for _ in range(inflated_mb * (1 << 20) // len(ops)))
    stream += deflate.compress(b" ET") + deflate.flush()
    return _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
                 b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                 b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 5 0 R "
                 b"/Resources << /Font << /F1 3 0 R >> >> >>",
                 b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"])


def nested_html(depth: int) -> str:
    """A page whose one paragraph sits inside ``depth`` nested <div> elements."""
    return "<html><body>" + "<div>" * depth + "<p>Deep inside.</p>" + "</div>" * depth + "</body></html>"
