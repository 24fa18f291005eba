"""SQLAlchemy models. Importing this package registers every table on the metadata."""

from app.db.models.accounts import RefreshToken, User
from app.db.models.projects import ApiKey, Project, ProjectMember, RuntimeToken

__all__ = ["ApiKey", "Project", "ProjectMember", "RefreshToken", "RuntimeToken", "User"]
