"""The dashboard page and its assets (served by service.api.controllers.dashboard)."""
