#!/usr/bin/python3
"""Lists the parts cloud-init sees in a userData, as JSON, for autonode's
oracle test (tests/tests/integration/userdata_oracle.rs).

Reads the raw userData (bytes, possibly gzip) on stdin, or from each file
named on the command line (one JSON line each), and runs it through
cloud-init's own user-data processing, cloudinit.user_data.UserDataProcessor,
the code that splits userData into parts before any handler runs. Prints
{"parts": [{"type": ..., "payload": <base64>}...]} with each part's content
type after cloud-init's own sniffing and its payload decoded as cloud-init's
handlers receive it, or {"error": ...} when cloud-init refuses the userData.

Nothing is written: cloud-init's paths point into a fresh temporary
directory, and the userData must not use #include (which would fetch URLs).
"""

import base64
import json
import sys
import tempfile

from cloudinit import helpers, util
from cloudinit.user_data import UserDataProcessor


def payload_bytes(part):
    """The payload as cloud-init's part handlers receive it, as bytes."""
    payload = util.fully_decoded_payload(part)
    if payload is None:
        return b""
    if isinstance(payload, str):
        # fully_decoded_payload decodes text with surrogateescape: undo it.
        return payload.encode("utf-8", "surrogateescape")
    return payload


def cloud_init_parts(raw):
    """What cloud-init makes of one userData, as a JSON-ready dict."""
    with tempfile.TemporaryDirectory() as cloud_dir:
        paths = helpers.Paths({"cloud_dir": cloud_dir, "run_dir": cloud_dir})
        try:
            message = UserDataProcessor(paths).process(raw)
        except Exception as error:  # cloud-init refuses: say why, as data
            return {"error": str(error)}
    parts = []
    for part in message.walk():
        if part.get_content_maintype() == "multipart":
            continue
        parts.append(
            {
                "type": part.get_content_type(),
                "payload": base64.b64encode(payload_bytes(part)).decode(),
            }
        )
    return {"parts": parts}


def main():
    if len(sys.argv) == 1:
        json.dump(cloud_init_parts(sys.stdin.buffer.read()), sys.stdout)
        return
    # One JSON line per file: one Python start-up for many userDatas.
    for path in sys.argv[1:]:
        with open(path, "rb") as file:
            print(json.dumps(cloud_init_parts(file.read())))


if __name__ == "__main__":
    main()
