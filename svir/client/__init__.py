"""svir's own clients: the terminal chat (`svir chat`), the model list (`svir models`) and the
server probe (`svir probe`). They speak HTTP with httpx and read streams with the wire core's
decoder, so they see exactly what any OpenAI-compatible client sees.
"""
