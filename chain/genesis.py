"""Genesis: the chain's first state, from a small validated document.

The reward pool is funded here and nowhere else, so total supply is fixed at genesis: fees and
slashes go to the module account, rewards come out of the pool.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chain.params import MODULE_ACCOUNT, REWARD_POOL_ACCOUNT, ModuleParams
from chain.state import ChainState, get_or_create_account
from protocol.messages import Address


class Genesis(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # genesis_time finite

    chain_id: str = Field("gonka-devnet", min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")
    genesis_time: float = Field(0.0, ge=0, description="unix seconds of block 1")
    authority: Address = Field(description="the only address allowed to create runs")
    accounts: dict[Address, int] = Field(default_factory=dict, description="address -> ngonka")
    reward_pool: int = Field(0, ge=0)
    params: ModuleParams = ModuleParams()

    @model_validator(mode="after")
    def _valid(self) -> Genesis:
        negative = sorted(a for a, amount in self.accounts.items() if amount < 0)
        if negative:
            raise ValueError(f"negative genesis balances: {negative}")
        if REWARD_POOL_ACCOUNT in self.accounts:
            raise ValueError("fund the reward pool with `reward_pool`, not as an account")
        return self


def genesis_state(genesis: Genesis) -> ChainState:
    """Account numbers: module accounts first, then funded accounts in sorted address order."""
    state = ChainState(
        chain_id=genesis.chain_id, authority=genesis.authority, params=genesis.params.model_dump()
    )
    get_or_create_account(state, MODULE_ACCOUNT)
    get_or_create_account(state, REWARD_POOL_ACCOUNT).balance = genesis.reward_pool
    for address in sorted(genesis.accounts):
        get_or_create_account(state, address).balance += genesis.accounts[address]
    get_or_create_account(state, genesis.authority)
    return state
