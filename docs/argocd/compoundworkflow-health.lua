-- Argo CD health of a compass.io CompoundWorkflow, from its status.phase and conditions.
-- Searching, Profiling and Planning are Progressing; Ready is Healthy; Failed is Degraded;
-- Planned (spec.autoApply false: the plan waits for review in status.plannedPolicy) is
-- Suspended. A plan that cannot be applied (PolicyReady False: PolicyConflict,
-- PolicyCrdMissing) waits for a person: Degraded. A phase this script does not know is
-- Unknown, so a newer operator is never reported Healthy by mistake.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local phases = {
  Pending = "Progressing",
  Searching = "Progressing",
  Profiling = "Progressing",
  Planning = "Progressing",
  Planned = "Suspended",
  Ready = "Healthy",
  Failed = "Degraded",
}
-- PolicyReady reasons of a plan the operator cannot write until someone acts.
local blocked = { PolicyConflict = true, PolicyCrdMissing = true }

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to take the workflow"
  return hs
end
local observed = obj.status.observedGeneration
if observed ~= nil and obj.metadata.generation ~= nil and observed < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to take generation " .. obj.metadata.generation
  return hs
end

local phase = obj.status.phase
local status = phases[phase]
if status == nil then
  hs.status = "Unknown"
  hs.message = "phase " .. phase .. " is unknown to this health check: update it (docs/argocd/)"
  return hs
end
local ready = condition("Ready")
hs.message = phase
if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  hs.message = phase .. ": " .. ready.message
end
local policy = condition("PolicyReady")
if phase == "Planning" and policy ~= nil and policy.status == "False" and blocked[policy.reason] then
  status = "Degraded"
  hs.message = phase .. ": " .. policy.reason .. ": " .. (policy.message or "")
end
hs.status = status
return hs
