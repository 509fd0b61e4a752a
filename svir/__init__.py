"""svir: one OpenAI-compatible endpoint in front of many model servers, one canonical stream."""

__version__ = "0.1.0"
