"""Delta query of the Graph simulator (:class:`Delta`): each full or incremental sync is
a round over one folder, fixed at its start; skip tokens lead through a round's pages
(the same page asked for twice links to the same next page), and its last page gives
a delta token for the changes after it, which can expire (``delta_token_ttl``, or
:meth:`GraphSimulator.expire_delta_tokens`) and then answers 410 SyncStateNotFound."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from synckit.examples.graph_mail.graph_shapes import folder_name, graph_error
from synckit.testing.replies import RecordedRequest, Reply

if TYPE_CHECKING:
    from synckit.examples.graph_mail.simulator import GraphSimulator, Mailbox

__all__ = ["Delta"]


@dataclass(frozen=True)
class _Round:
    """One pass of delta paging over a folder: the messages it reports, fixed at its start."""

    number: int
    tenant: str
    folder: str
    ids: tuple[str, ...]
    upto: int


@dataclass
class _DeltaState:
    tenant: str
    folder: str
    upto: int
    issued_at: datetime
    expired: bool = False


class Delta:
    """The delta rounds of one simulator and the tokens that lead through them."""

    def __init__(self, sim: GraphSimulator) -> None:
        self.sim = sim
        self._rounds: dict[int, _Round] = {}
        self._skiptokens: dict[str, tuple[int, int]] = {}
        self._skip_by_position: dict[tuple[int, int], str] = {}
        self._delta_tokens: dict[str, _DeltaState] = {}
        self._delta_by_round: dict[int, str] = {}

    def expire(self, tenant: str | None = None, folder: str | None = None) -> int:
        """Make every delta token issued so far (for ``tenant``/``folder``, if given) answer
        410 Gone; returns how many were expired."""
        with self.sim.api.lock:
            count = 0
            for state in self._delta_tokens.values():
                if (tenant in (None, state.tenant)) and (folder in (None, state.folder)):
                    count += not state.expired
                    state.expired = True
            return count

    def page(self, mailbox: Mailbox, request: RecordedRequest) -> Any:
        """``GET /me/mailFolders/{folder}/messages/delta``: a page of a round, new (no
        token: a full sync; a delta token: the changes since it) or going on (a skip
        token)."""
        folder = folder_name(request.params["folder"])
        if folder is None:
            return graph_error(404, "ErrorItemNotFound", "The specified folder was not found.")
        tenant = mailbox.tenant
        skiptoken = request.query.get("$skiptoken")
        deltatoken = request.query.get("$deltatoken")
        if skiptoken is not None:
            found = self._skiptokens.get(skiptoken)
            round_ = self._rounds.get(found[0]) if found else None
            if (
                found is None
                or round_ is None
                or (round_.tenant, round_.folder)
                != (
                    tenant,
                    folder,
                )
            ):
                return self._sync_state_not_found(tenant)
            offset = found[1]
        elif deltatoken is not None:
            state = self._delta_tokens.get(deltatoken)
            too_old = (
                state is not None
                and self.sim.delta_token_ttl is not None
                and self.sim.clock() - state.issued_at > self.sim.delta_token_ttl
            )
            if (
                state is None
                or state.expired
                or too_old
                or (state.tenant, state.folder) != (tenant, folder)
            ):
                return self._sync_state_not_found(tenant)
            round_, offset = self._new_round(tenant, folder, since=state.upto), 0
        else:
            self.sim.stats.full_syncs[tenant] += 1
            round_, offset = self._new_round(tenant, folder, since=None), 0
        size = self.sim.page_size_of(request)
        link = f"{request.base_url}/v1.0/me/mailFolders/{request.params['folder']}/messages/delta"
        body: dict[str, Any] = {
            "@odata.context": f"{request.base_url}/v1.0/$metadata#Collection(message)",
            "value": [self._delta_entry(i) for i in round_.ids[offset : offset + size]],
        }
        if offset + size < len(round_.ids):
            body["@odata.nextLink"] = f"{link}?$skiptoken={self._skiptoken(round_, offset + size)}"
        else:
            body["@odata.deltaLink"] = f"{link}?$deltatoken={self._deltatoken(round_)}"
        return body

    def _sync_state_not_found(self, tenant: str) -> Reply:
        self.sim.stats.expired_delta_tokens[tenant] += 1
        return graph_error(
            410,
            "SyncStateNotFound",
            "The sync state generation is not found or has expired. Start a full sync.",
        )

    def _new_round(self, tenant: str, folder: str, *, since: int | None) -> _Round:
        if since is None:
            chosen = self.sim.folder_items(tenant, folder)
        else:
            chosen = sorted(
                (
                    i
                    for i in self.sim.items.values()
                    if i.tenant == tenant and i.folder == folder and i.seq > since
                ),
                key=lambda i: i.seq,
            )
        number = len(self._rounds) + 1
        round_ = _Round(number, tenant, folder, tuple(i.id for i in chosen), self.sim.seq)
        self._rounds[number] = round_
        return round_

    def _delta_entry(self, message_id: str) -> dict[str, Any]:
        item = self.sim.items[message_id]
        if item.deleted:
            return {
                "@odata.type": "#microsoft.graph.message",
                "id": item.id,
                "@removed": {"reason": "deleted"},
            }
        return dict(item.data)

    def _skiptoken(self, round_: _Round, offset: int) -> str:
        # The same page asked for twice (a retry) links to the same next page.
        key = (round_.number, offset)
        if key not in self._skip_by_position:
            token = self.sim.opaque("sk")
            self._skip_by_position[key] = token
            self._skiptokens[token] = key
        return self._skip_by_position[key]

    def _deltatoken(self, round_: _Round) -> str:
        if round_.number not in self._delta_by_round:
            token = self.sim.opaque("dt")
            self._delta_by_round[round_.number] = token
            self._delta_tokens[token] = _DeltaState(
                round_.tenant, round_.folder, round_.upto, self.sim.clock()
            )
        return self._delta_by_round[round_.number]
