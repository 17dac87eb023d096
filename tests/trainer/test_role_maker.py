"""Role makers read Paddle's (and torchrun's) environment exactly, and say what is wrong."""

from __future__ import annotations

import re

import pytest

from trainer import ClusterRole, PaddleCloudRoleMaker, Role, RoleError, UserDefinedRoleMaker

SERVERS = "127.0.0.1:6001,127.0.0.1:6002"


def ps_env(**extra: str) -> dict[str, str]:
    env = {"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS_NUM": "2"}
    env.update(extra)
    return env


def role_of(env: dict[str, str], is_collective: bool = False) -> ClusterRole:
    return PaddleCloudRoleMaker(is_collective, environ=env).generate_role()


def test_no_role_environment_is_one_local_worker():
    for is_collective in (False, True):
        role = role_of({}, is_collective)
        assert (role.role, role.index, role.worker_num, role.distributed) == (
            Role.WORKER, 0, 1, False,
        )
        assert role.is_collective is is_collective and role.server_endpoints == ()


def test_trainer_and_pserver_roles():
    worker = role_of(ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="1",
                            FLEETFEED_JOB_KEY="s3cret-k3y-of-the-role-test"))
    assert worker == ClusterRole(
        Role.WORKER, 1, 2, ("127.0.0.1:6001", "127.0.0.1:6002"),
        job_secret="s3cret-k3y-of-the-role-test",
    )
    server = role_of(ps_env(TRAINING_ROLE="PSERVER", POD_IP="127.0.0.1", PADDLE_PORT="6002",
                            PADDLE_TRAINER_ENDPOINTS="127.0.0.1:7001,127.0.0.1:7002"))
    assert server.is_server and server.index == 1 and server.server_num == 2
    assert server.worker_endpoints == ("127.0.0.1:7001", "127.0.0.1:7002")
    assert server.job_secret is None and server.distributed


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (ps_env(PADDLE_TRAINER_ID="0"),
         r"TRAINING_ROLE must be set in the environment, found not set"),
        (ps_env(TRAINING_ROLE="WORKER"),
         r"TRAINING_ROLE must be TRAINER or PSERVER, found 'WORKER'"),
        (ps_env(TRAINING_ROLE="TRAINER"), r"PADDLE_TRAINER_ID must be set .*found not set"),
        (ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="x1"),
         r"PADDLE_TRAINER_ID must be an integer, found 'x1'"),
        (ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="2"),
         r"below PADDLE_TRAINERS_NUM=2, found 2"),
        ({**ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="0"), "PADDLE_TRAINERS_NUM": "0"},
         r"PADDLE_TRAINERS_NUM must be an integer >= 1, found '0'"),
        ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "TRAINING_ROLE": "TRAINER",
          "PADDLE_TRAINER_ID": "0"},
         r"PADDLE_TRAINERS_NUM must be set in the environment, found not set"),
        (ps_env(PADDLE_PSERVERS_IP_PORT_LIST="127.0.0.1", TRAINING_ROLE="TRAINER",
                PADDLE_TRAINER_ID="0"),
         r"PADDLE_PSERVERS_IP_PORT_LIST must be 'host:port' entries .*found '127.0.0.1'"),
        (ps_env(TRAINING_ROLE="PSERVER", POD_IP="127.0.0.1"), r"PADDLE_PORT must be set"),
        (ps_env(TRAINING_ROLE="PSERVER", PADDLE_PORT="6001"), r"POD_IP must be set"),
        (ps_env(TRAINING_ROLE="PSERVER", PADDLE_PORT="70000", POD_IP="127.0.0.1"),
         r"PADDLE_PORT must be an integer in 1..65535, found '70000'"),
        (ps_env(TRAINING_ROLE="PSERVER", PADDLE_PORT="6003", POD_IP="127.0.0.1"),
         r"'127.0.0.1:6003' is not in PADDLE_PSERVERS_IP_PORT_LIST"),
        ({"TRAINING_ROLE": "PSERVER"}, r"PADDLE_PSERVERS_IP_PORT_LIST is not set"),
        (ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="0",
                PADDLE_TRAINER_ENDPOINTS="127.0.0.1:7001"),
         r"PADDLE_TRAINER_ENDPOINTS lists 1 endpoints but PADDLE_TRAINERS_NUM is 2"),
    ],
)
def test_ps_environment_errors_name_the_variable_and_value(env, message):
    with pytest.raises(RoleError, match=message):
        role_of(env)


def test_collective_roles_from_torchrun_and_paddle():
    maker = PaddleCloudRoleMaker(True, environ={
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
    })
    role = maker.generate_role()
    assert (role.index, role.worker_num, role.is_collective, role.distributed) == (3, 4, True, True)
    assert maker.master_endpoint == "10.0.0.1:29500" and maker.local_rank == 1
    paddle = PaddleCloudRoleMaker(True, environ={
        "PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:7001,127.0.0.1:7002",
    })
    assert paddle.generate_role().index == 1 and paddle.master_endpoint == "127.0.0.1:7001"
    with pytest.raises(
        RoleError, match="MASTER_PORT must be set in the environment, found not set"
    ):
        role_of({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, True)
    with pytest.raises(RoleError, match="WORLD_SIZE must be an integer, found 'two'"):
        role_of({"RANK": "0", "WORLD_SIZE": "two"}, True)
    with pytest.raises(RoleError, match="RANK must be below WORLD_SIZE=2, found 2"):
        role_of({"RANK": "2", "WORLD_SIZE": "2"}, True)


def test_user_defined_role_maker():
    server = UserDefinedRoleMaker(
        current_id=0, role=Role.SERVER, worker_num=2,
        server_endpoints=["127.0.0.1:6001"], job_secret="k",
    ).generate_role()
    assert server == ClusterRole(Role.SERVER, 0, 2, ("127.0.0.1:6001",), job_secret="k")
    worker = UserDefinedRoleMaker(
        current_id=1, role=Role.WORKER, server_endpoints=["127.0.0.1:6001"],
        worker_endpoints=["127.0.0.1:7001", "127.0.0.1:7002"],
    ).generate_role()
    assert worker.worker_num == 2 and worker.index == 1 and worker.is_worker
    paddle_style = UserDefinedRoleMaker(
        current_id=0, role=Role.WORKER, worker_num=3, server_endpoints=["127.0.0.1:6001"],
    )  # Paddle's private role-maker methods, which some scripts call
    assert (paddle_style._worker_num(), paddle_style._server_num()) == (3, 1)
    assert paddle_style._is_first_worker() and not paddle_style._is_server()
    collective = UserDefinedRoleMaker(
        True, current_id=1, worker_endpoints=["127.0.0.1:7001", "127.0.0.1:7002"]
    )
    assert collective.generate_role().is_collective
    assert collective.master_endpoint == "127.0.0.1:7001"
    with pytest.raises(RoleError, match="current_id must be below the 1 server endpoints, found 1"):
        UserDefinedRoleMaker(current_id=1, role=Role.SERVER, worker_num=1,
                             server_endpoints=["127.0.0.1:6001"]).generate_role()
    with pytest.raises(RoleError, match="worker_num is 0 and worker_endpoints is empty"):
        UserDefinedRoleMaker(server_endpoints=["127.0.0.1:6001"]).generate_role()
    with pytest.raises(RoleError, match="role must be Role.WORKER or Role.SERVER, found 7"):
        UserDefinedRoleMaker(
            role=7, worker_num=1, server_endpoints=["127.0.0.1:6001"]
        ).generate_role()
    with pytest.raises(RoleError, match="needs server_endpoints, found none"):
        UserDefinedRoleMaker(worker_num=1).generate_role()
    with pytest.raises(RoleError, match="server_endpoints must be 'host:port' .*found 'nohost'"):
        UserDefinedRoleMaker(worker_num=1, server_endpoints=["nohost"])
    with pytest.raises(TypeError, match="is_collective must be a bool, got 'yes'"):
        UserDefinedRoleMaker("yes")


def test_every_process_of_a_two_host_job_from_paddles_variables():
    # What Paddle's cluster launchers (and Kubernetes operators) set on two hosts.
    job = {
        "PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:6001,10.0.0.2:6001",
        "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6002,10.0.0.2:6002",
        "PADDLE_TRAINERS_NUM": "2",
    }
    server, trainer = {"TRAINING_ROLE": "PSERVER"}, {"TRAINING_ROLE": "TRAINER"}
    processes = [
        ({**server, "POD_IP": "10.0.0.1", "PADDLE_PORT": "6001"}, Role.SERVER, 0),
        ({**server, "POD_IP": "10.0.0.2", "PADDLE_PORT": "6001"}, Role.SERVER, 1),
        ({**trainer, "PADDLE_TRAINER_ID": "0", "POD_IP": "10.0.0.1"}, Role.WORKER, 0),
        ({**trainer, "PADDLE_TRAINER_ID": "1", "POD_IP": "10.0.0.2"}, Role.WORKER, 1),
    ]
    for own, kind, index in processes:
        role = role_of({**job, **own})
        assert (role.role, role.index, role.worker_num, role.server_num) == (kind, index, 2, 2)
        assert role.server_endpoints == ("10.0.0.1:6001", "10.0.0.2:6001")
        assert role.worker_endpoints == ("10.0.0.1:6002", "10.0.0.2:6002")


def test_a_server_named_by_host_name_finds_its_index_from_its_address():
    env = ps_env(PADDLE_PSERVERS_IP_PORT_LIST="localhost:6001,127.0.0.1:6002",
                 TRAINING_ROLE="PSERVER", POD_IP="127.0.0.1", PADDLE_PORT="6001")
    assert role_of(env).index == 0
    with pytest.raises(RoleError, match=r"'127.0.0.1:6003' is not in PADDLE_PSERVERS_IP_PORT_LIST"):
        role_of({**env, "PADDLE_PORT": "6003"})


@pytest.mark.parametrize(
    ("env", "launch"),
    [
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
          "MASTER_PORT": "29500"},
         r"rank 1 of WORLD_SIZE=2 \(torchrun, or fleetrun --nproc_per_node\)"),
        ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:7001,127.0.0.1:7002"},
         r"trainer 0 of the 2 in PADDLE_TRAINER_ENDPOINTS \(Paddle's collective launcher\)"),
    ],
)
def test_a_parameter_server_role_maker_in_a_collective_launch_names_the_fix(env, launch):
    # Without the check each of the N processes fell back to a job of its own:
    # N copies of worker 0 of 1.
    with pytest.raises(
        RoleError,
        match=f"this process is {launch}, but a parameter-server role maker "
        r"\(fleet.init\(\) without is_collective=True\) finds no parameter-server roles .* "
        r"call fleet.init\(is_collective=True\) for a collective job, or start a "
        "parameter-server job with fleetrun --server_num=S --worker_num=W",
    ):
        role_of(env)


def test_a_one_process_launch_still_runs_the_local_fallback():
    for env in ({"RANK": "0", "WORLD_SIZE": "1"},
                {"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:7001"}):
        role = role_of(env)
        assert (role.index, role.worker_num, role.distributed) == (0, 1, False)


@pytest.mark.parametrize(
    ("env", "started_as"),
    [
        (ps_env(TRAINING_ROLE="PSERVER", POD_IP="127.0.0.1", PADDLE_PORT="6001"),
         "PSERVER (TRAINING_ROLE='PSERVER', "),
        (ps_env(TRAINING_ROLE="TRAINER", PADDLE_TRAINER_ID="1",
                PADDLE_TRAINER_ENDPOINTS="127.0.0.1:7001,127.0.0.1:7002"),
         "TRAINER (TRAINING_ROLE='TRAINER', "),
        ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS}, "process (TRAINING_ROLE=not set, "),
    ],
)
def test_a_collective_role_maker_in_a_parameter_server_launch_names_the_fix(env, started_as):
    # A worker used to take a collective role from PADDLE_TRAINER_ENDPOINTS, a
    # server the local fallback.
    with pytest.raises(
        RoleError,
        match=re.escape(f"this process was started as a parameter-server job's {started_as}")
        + r".* call fleet.init\(\) for a parameter-server job, or start a collective job with "
        "fleetrun --nproc_per_node=N",
    ):
        role_of(env, True)
