"""Users, login and rotating refresh tokens."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from uuid import UUID, uuid4

from advanced_alchemy.exceptions import DuplicateKeyError, IntegrityError
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import func, select, update

from app.db.models import RefreshToken, User
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.schemas import TokenPair
from app.lib.clock import utcnow
from app.lib.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    PermissionDeniedError,
    RateLimitedError,
)
from app.lib.hashing import random_secret, sha256_hex
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.tokens import TokenService

ACCESS_AUDIENCE = "user"
RUNTIME_AUDIENCE = "runtime"
REFRESH_PREFIX = "rt-"
INVALID_CREDENTIALS = "invalid email or password"
# Access tokens carry the id of the refresh-token family (the login session) they
# belong to, so logging out with an access token alone ends the whole session.
FAMILY_CLAIM = "fid"
# A refresh racing the revocation can mint one more access token just after the mark.
FAMILY_MARK_MARGIN_SECONDS = 60


def family_mark_until(revoked_epoch: float, settings: Settings) -> float:
    """Until when a family revoked at ``revoked_epoch`` must stay marked: as long as an
    access token minted from it before then can live."""
    return revoked_epoch + settings.access_token_ttl_seconds + FAMILY_MARK_MARGIN_SECONDS


# Held (in the shared StateStore) by the one registration allowed to become the
# first admin; see AuthService.register.
FIRST_ADMIN_LEASE = "accounts:first-admin"
FIRST_ADMIN_LEASE_SECONDS = 60.0


def normalize_email(email: str) -> str:
    value = email.strip().lower()
    local, at, domain = value.partition("@")
    if not at or not local or "." not in domain or " " in value:
        raise BadRequestError("email is not a valid address", code="invalid_email", param="email")
    return value


class UserService(SQLAlchemyAsyncRepositoryService[User]):
    class Repo(SQLAlchemyAsyncRepository[User]):
        model_type = User

    repository_type = Repo

    async def get_by_email(self, email: str) -> User | None:
        return await self.get_one_or_none(User.email == email)

    async def count_users(self) -> int:
        result = await self.repository.session.execute(select(func.count()).select_from(User))
        return int(result.scalar_one())

    async def create_user(
        self, *, email: str, password_hash: str, name: str, is_admin: bool
    ) -> User:
        try:
            return await self.create(
                User(email=email, name=name, password_hash=password_hash, is_admin=is_admin),
                auto_commit=True,
            )
        except (DuplicateKeyError, IntegrityError) as exc:
            raise ConflictError(
                "a user with this email already exists", code="email_taken", param="email"
            ) from exc


class RefreshTokenService(SQLAlchemyAsyncRepositoryService[RefreshToken]):
    class Repo(SQLAlchemyAsyncRepository[RefreshToken]):
        model_type = RefreshToken

    repository_type = Repo

    async def mint(self, user_id: UUID, family_id: UUID, ttl_seconds: int) -> str:
        token = random_secret(REFRESH_PREFIX)
        await self.create(
            RefreshToken(
                user_id=user_id,
                family_id=family_id,
                token_hash=sha256_hex(token),
                expires_at=utcnow() + datetime.timedelta(seconds=ttl_seconds),
            ),
            auto_commit=True,
        )
        return token

    async def spend(self, row_id: UUID) -> bool:
        """Mark a link used; False when someone else already spent or revoked it.

        A conditional UPDATE (not read-then-write) so two concurrent refreshes with
        the same token cannot both succeed.
        """
        result = await self.repository.session.execute(
            update(RefreshToken)
            .where(
                RefreshToken.id == row_id,
                RefreshToken.used_at.is_(None),
                RefreshToken.revoked_at.is_(None),
            )
            .values(used_at=utcnow(), updated_at=utcnow())
        )
        await self.repository.session.commit()
        return bool(getattr(result, "rowcount", 0) == 1)

    async def family_revoked(self, family_id: UUID) -> bool:
        """True once any link of the family was revoked.

        Revoking marks the links that exist at that moment; a link minted by a refresh
        racing the revocation is caught here, so a revoked family stays revoked.
        """
        result = await self.repository.session.execute(
            select(RefreshToken.id)
            .where(RefreshToken.family_id == family_id, RefreshToken.revoked_at.is_not(None))
            .limit(1)
        )
        return result.first() is not None

    async def was_spent(self, row_id: UUID) -> bool:
        """Read `used_at` afresh: the row loaded at the start of a refresh may be stale."""
        result = await self.repository.session.execute(
            select(RefreshToken.used_at).where(RefreshToken.id == row_id)
        )
        return result.scalar_one_or_none() is not None

    async def families_revoked_since(
        self, moment: datetime.datetime
    ) -> list[tuple[UUID, datetime.datetime]]:
        """Families revoked after ``moment``, each with its latest revocation time."""
        result = await self.repository.session.execute(
            select(RefreshToken.family_id, func.max(RefreshToken.revoked_at))
            .where(RefreshToken.revoked_at > moment)
            .group_by(RefreshToken.family_id)
        )
        return [(family_id, revoked_at) for family_id, revoked_at in result.all()]

    async def revoke_family(self, family_id: UUID) -> None:
        await self.repository.session.execute(
            update(RefreshToken)
            .where(RefreshToken.family_id == family_id, RefreshToken.revoked_at.is_(None))
            .values(revoked_at=utcnow(), updated_at=utcnow())
        )
        await self.repository.session.commit()


@dataclass(slots=True)
class AuthService:
    """Registration, login, refresh and logout, composed from the row services."""

    settings: Settings
    users: UserService
    refresh_tokens: RefreshTokenService
    passwords: PasswordHasher
    tokens: TokenService
    revocations: RevocationList
    state: StateStore

    async def register(self, *, email: str, password: str, name: str) -> User:
        if not self.settings.registration_open:
            raise PermissionDeniedError("registration is closed", code="registration_closed")
        normalized = normalize_email(email)
        if await self.users.get_by_email(normalized) is not None:
            raise ConflictError(
                "a user with this email already exists", code="email_taken", param="email"
            )
        is_admin = await self._claim_first_admin()
        try:
            password_hash = await self.passwords.hash(password)
            return await self.users.create_user(
                email=normalized, password_hash=password_hash, name=name.strip(), is_admin=is_admin
            )
        except BaseException:
            if is_admin:
                # Not created after all: let the next first registration have the role.
                await self.state.delete(FIRST_ADMIN_LEASE)
            raise

    async def _claim_first_admin(self) -> bool:
        """True for the registration that creates the first user.

        Counting users is not enough on its own: concurrent first registrations all
        count zero before any of them inserts, and would all become admins. Only the
        one that also wins the lease (atomic, shared by every replica) gets the role.
        """
        if await self.users.count_users() != 0:
            return False
        return await self.state.set_if_absent(
            FIRST_ADMIN_LEASE, b"1", ttl=FIRST_ADMIN_LEASE_SECONDS
        )

    async def login(self, *, email: str, password: str, client: str) -> TokenPair:
        user = await self.authenticate(email=email, password=password, client=client)
        return await self._issue_pair(user.id, family_id=uuid4())

    async def authenticate(self, *, email: str, password: str, client: str) -> User:
        """Check a login (rate limited per email and per client); the web console
        opens a session with the user, the API issues a token pair."""
        normalized = email.strip().lower()
        await self._admit_login_attempt(normalized, client)
        user = await self.users.get_by_email(normalized)
        if user is None:
            # Spend the same argon2 time as a real check: timing must not tell
            # an attacker which emails have accounts.
            await self.passwords.verify_dummy(password)
            raise AuthenticationError(INVALID_CREDENTIALS, code="invalid_credentials")
        if not await self.passwords.verify(user.password_hash, password):
            raise AuthenticationError(INVALID_CREDENTIALS, code="invalid_credentials")
        if user.disabled:
            raise AuthenticationError("this account is disabled", code="account_disabled")
        if self.passwords.needs_rehash(user.password_hash):
            user.password_hash = await self.passwords.hash(password)
            await self.users.update(user, auto_commit=True)
        return user

    async def refresh(self, refresh_token: str) -> TokenPair:
        row = await self.refresh_tokens.get_one_or_none(
            RefreshToken.token_hash == sha256_hex(refresh_token)
        )
        if row is None:
            raise AuthenticationError("refresh token is not valid", code="invalid_refresh_token")
        if row.used_at is not None:
            # A spent link presented again: the token leaked (or two clients raced).
            await self._revoke_reused_family(row)
        if row.revoked_at is not None or await self.refresh_tokens.family_revoked(row.family_id):
            # A concurrent duplicate may have revoked the family after our read; if this
            # very link was spent meanwhile, the honest answer is "reused".
            if await self.refresh_tokens.was_spent(row.id):
                await self._revoke_reused_family(row)
            raise AuthenticationError(
                "refresh token has been revoked; log in again", code="refresh_token_revoked"
            )
        if row.expires_at <= utcnow():
            raise AuthenticationError("refresh token has expired", code="refresh_token_expired")
        if not await self.refresh_tokens.spend(row.id):
            # Someone spent it between our read and our update.
            await self._revoke_reused_family(row)
        user = await self.users.get_one_or_none(User.id == row.user_id)
        if user is None or user.disabled:
            await self._end_family(row.family_id)
            raise AuthenticationError("this account is disabled", code="account_disabled")
        return await self._issue_pair(user.id, family_id=row.family_id)

    async def logout(
        self,
        *,
        user_id: UUID,
        access_jti: str,
        access_expires: float,
        family_id: UUID | None,
        refresh_token: str | None,
    ) -> None:
        await self.revocations.revoke(access_jti, access_expires)
        if family_id is not None:
            await self._end_family(family_id)
        if refresh_token is None:
            return
        row = await self.refresh_tokens.get_one_or_none(
            RefreshToken.token_hash == sha256_hex(refresh_token)
        )
        # Someone else's refresh token is treated as unknown: no oracle, no effect.
        if row is not None and row.user_id == user_id and row.family_id != family_id:
            await self._end_family(row.family_id)

    async def _end_family(self, family_id: UUID) -> None:
        """Revoke the login: its refresh links in the database, and every access token
        minted from it (they carry the family id) through the revocation list."""
        await self.refresh_tokens.revoke_family(family_id)
        await self.revocations.revoke_family(
            str(family_id), family_mark_until(time.time(), self.settings)
        )

    async def _revoke_reused_family(self, row: RefreshToken) -> None:
        await self._end_family(row.family_id)
        raise AuthenticationError(
            "refresh token was already used; every session of this login is revoked",
            code="refresh_token_reused",
        )

    async def _issue_pair(self, user_id: UUID, *, family_id: UUID) -> TokenPair:
        access = self.tokens.issue(
            subject=str(user_id),
            audience=ACCESS_AUDIENCE,
            ttl_seconds=self.settings.access_token_ttl_seconds,
            claims={FAMILY_CLAIM: str(family_id)},
        )
        refresh = await self.refresh_tokens.mint(
            user_id, family_id, self.settings.refresh_token_ttl_seconds
        )
        return TokenPair(
            access_token=access.token,
            refresh_token=refresh,
            expires_in=self.settings.access_token_ttl_seconds,
            refresh_expires_in=self.settings.refresh_token_ttl_seconds,
        )

    async def _admit_login_attempt(self, email: str, client: str) -> None:
        window = float(self.settings.login_window_seconds)
        limit = self.settings.login_max_attempts
        by_email = await self.state.admit(f"login:email:{sha256_hex(email)}", 1, limit, window)
        if not by_email.allowed:
            raise RateLimitedError(
                "too many login attempts for this account; try again later",
                retry_after=by_email.retry_after,
            )
        # One address may legitimately serve several people (NAT), so it gets more room.
        by_client = await self.state.admit(f"login:client:{client}", 1, limit * 5, window)
        if not by_client.allowed:
            raise RateLimitedError(
                "too many login attempts from this address; try again later",
                retry_after=by_client.retry_after,
            )
