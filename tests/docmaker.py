"""Small real PDF and HTML files written by the tests themselves (no binary fixtures)."""
from __future__ import annotations


def pdf_bytes(pages: list[list[str]], title: str = "") -> bytes:
    """A valid PDF 1.4: one Helvetica text line per string, one page per list, optional Info title."""
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"]
    for i, lines in enumerate(pages):
        text = " T* ".join(f"({esc(line)}) Tj" for line in lines)
        stream = f"BT /F1 11 Tf 14 TL 50 740 Td {text} ET".encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>".encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    if title:
        objects.append(f"<< /Title ({esc(title)}) >>".encode("latin-1"))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    info = f" /Info {len(objects)} 0 R" if title else ""
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode()
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
