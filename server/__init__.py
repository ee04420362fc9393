"""The durable OpenAI-compatible Files and Batches API, served beside SGLang's own routes.

`config` says where the data lives and the limits; `store` keeps files, batches and their lines in
SQLite or PostgreSQL; `blobs` keeps file contents on disk; `routes` is the HTTP surface; `runner`
executes batch lines as offline work through the server's own OpenAI routes; `install` wires all of
it into SGLang's FastAPI app.
"""

if __name__ != "sgl_blend.server":
    # Imported as a top-level `server` (the repository root on sys.path) the same files would load a
    # second time under another name, with their own module state; the only name is sgl_blend.server.
    raise ImportError("`server/` is the package sgl_blend.server; import it by that name")
