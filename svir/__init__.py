"""svir: one OpenAI-compatible endpoint in front of many model servers, with one canonical stream."""

__version__ = "0.1.0"
