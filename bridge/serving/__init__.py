"""serve's protocol, shared by every front door that speaks it: `serve` on stdin/stdout and the network door.

- `requests`: the requests a client may send, checked, and the error codes;
- `session`: one client's requests handled on a host (`ClientSession`, `Tenant`);
- `output`: one client's responses, written whole and in order;
- `file_delivery`: the files agents leave, offered and deleted once taken.
"""
