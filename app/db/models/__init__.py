"""SQLAlchemy models. Importing this package registers every table on the metadata."""

from app.db.models.accounts import RefreshToken, TokenRevocation, User
from app.db.models.agents import AgentDeployment, AgentNode
from app.db.models.conversations import Conversation, ConversationMessage, FallbackPin
from app.db.models.prices import ModelPrice
from app.db.models.profiles import ModelProfile, PlatformSetting, ProjectProfileSettings
from app.db.models.projects import ApiKey, Project, ProjectMember, RuntimeToken
from app.db.models.routing import BackendConfig, ModelAlias
from app.db.models.tenancy import CustomLlm, OverrideKey, ProjectQuota, ProjectSecret
from app.db.models.usage import UsageRecord
from app.db.models.video import VideoJob, VideoPrice
from app.db.models.webhooks import ProjectWebhook, WebhookDelivery

__all__ = [
    "AgentDeployment",
    "AgentNode",
    "ApiKey",
    "BackendConfig",
    "Conversation",
    "ConversationMessage",
    "CustomLlm",
    "FallbackPin",
    "ModelAlias",
    "ModelPrice",
    "ModelProfile",
    "OverrideKey",
    "PlatformSetting",
    "Project",
    "ProjectMember",
    "ProjectProfileSettings",
    "ProjectQuota",
    "ProjectSecret",
    "ProjectWebhook",
    "RefreshToken",
    "RuntimeToken",
    "TokenRevocation",
    "UsageRecord",
    "User",
    "VideoJob",
    "VideoPrice",
    "WebhookDelivery",
]
