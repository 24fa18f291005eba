"""Associated data of every encrypted column, defined once each.

A vault token only opens with the associated data it was sealed with, which names
its owner row: copied to another row, column or project it fails to decrypt. Every
writer and reader of a column (its area's services, ``arona vault rotate``) must
use the function below for it, never build the parts by hand.

=========================  =====================================  =================
column                     associated data                        function
=========================  =====================================  =================
backend_configs            ("backend_config", id)                 ``backend_config_aad``
  .api_key_encrypted
project_secrets            ("project_secret", project_id, id)     ``secret_aad``
  .value_encrypted
custom_llms                ("custom_llm", project_id, id)         ``custom_llm_aad``
  .api_key_encrypted
override_keys              ("override_key", project_id, id)       ``override_key_aad``
  .key_encrypted
project_webhooks           ("project_webhook", project_id, id)    ``webhook_secret_aad``
  .secret_encrypted
project_webhooks           ("project_webhook_previous",           ``webhook_previous_aad``
  .previous_secret_        project_id, id)
  encrypted
=========================  =====================================  =================

The row id must exist before the value is sealed: create it with ``uuid4()`` in
Python and pass it to the model, as ``ProjectSecretService.create_secret`` does.
"""

from __future__ import annotations

from uuid import UUID

from app.domain.backends.services import key_aad as _backend_key_aad
from app.lib.vault import aad

SECRET_KIND = "project_secret"  # noqa: S105 (a label, not a password)
CUSTOM_LLM_KIND = "custom_llm"
OVERRIDE_KEY_KIND = "override_key"
WEBHOOK_KIND = "project_webhook"
# The previous secret has its own kind: moved into the current column (or back) it
# must not open.
WEBHOOK_PREVIOUS_KIND = "project_webhook_previous"


def backend_config_aad(row_id: UUID) -> bytes:
    """``backend_configs.api_key_encrypted`` (platform-wide, so no project)."""
    return _backend_key_aad(row_id)


def secret_aad(project_id: UUID, secret_id: UUID) -> bytes:
    """``project_secrets.value_encrypted``."""
    return aad(SECRET_KIND, project_id, secret_id)


def custom_llm_aad(project_id: UUID, row_id: UUID) -> bytes:
    """``custom_llms.api_key_encrypted`` (a key typed in directly, not a secret)."""
    return aad(CUSTOM_LLM_KIND, project_id, row_id)


def override_key_aad(project_id: UUID, row_id: UUID) -> bytes:
    """``override_keys.key_encrypted``."""
    return aad(OVERRIDE_KEY_KIND, project_id, row_id)


def webhook_secret_aad(project_id: UUID, row_id: UUID) -> bytes:
    """``project_webhooks.secret_encrypted`` (the signing secret)."""
    return aad(WEBHOOK_KIND, project_id, row_id)


def webhook_previous_aad(project_id: UUID, row_id: UUID) -> bytes:
    """``project_webhooks.previous_secret_encrypted`` (still signing after a rotation)."""
    return aad(WEBHOOK_PREVIOUS_KIND, project_id, row_id)
