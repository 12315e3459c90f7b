"""``ctx.http``: the paced, classifying HTTP client a connector calls its API with, and its
HTTP/1.1 transport."""
