"""The durable OpenAI-compatible Files and Batches API, served beside SGLang's own routes.

`config` says where the data lives and the limits; `store` keeps files, batches and their lines in
SQLite or PostgreSQL; `blobs` keeps file contents on disk; `routes` is the HTTP surface; `runner`
executes batch lines as offline work through the server's own OpenAI routes; `install` wires all of
it into SGLang's FastAPI app.
"""
