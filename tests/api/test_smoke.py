from tests.support.helpers import bearer, login, new_project, register, unique_email


async def test_register_login_me_project_key(any_client):
    email = unique_email()
    await register(any_client, email)
    tokens = await login(any_client, email)
    me = await any_client.get("/api/auth/me", headers=bearer(tokens["accessToken"]))
    assert me.status_code == 200, me.text
    assert me.json()["email"] == email
    project = await new_project(any_client, bearer(tokens["accessToken"]))
    created = await any_client.post(
        f"/api/projects/{project['id']}/api-keys",
        json={"name": "ci"},
        headers=bearer(tokens["accessToken"]),
    )
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    assert key.startswith("ak-")
    via_key = await any_client.get(f"/api/projects/{project['id']}", headers=bearer(key))
    assert via_key.status_code == 200, via_key.text
    assert via_key.json()["role"] == "api_key"
