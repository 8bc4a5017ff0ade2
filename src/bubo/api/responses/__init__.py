"""The OpenAI Responses dialect: create, retrieve and delete responses; continuations by id."""

from .routes import blueprint as blueprint
