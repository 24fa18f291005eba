"""SQLAlchemy models. Importing this package registers every table on the metadata."""

from app.db.models.accounts import RefreshToken, User
from app.db.models.projects import ApiKey, Project, ProjectMember, RuntimeToken
from app.db.models.routing import BackendConfig, ModelAlias
from app.db.models.usage import UsageRecord

__all__ = [
    "ApiKey",
    "BackendConfig",
    "ModelAlias",
    "Project",
    "ProjectMember",
    "RefreshToken",
    "RuntimeToken",
    "UsageRecord",
    "User",
]
