-- Argo CD health of a compass.io ParetoPolicy, from its status conditions.
-- Degraded: the spec can never work (InvalidSpec, TargetNotAllowed), another policy acts on
-- its target (TargetClaimed), Triton or the metrics
-- cannot be reached, a switch failed, or the pause annotation is invalid. Suspended: paused
-- (spec.paused or the compass.io/paused annotation). Progressing: no decision yet for this
-- generation, or pods not yet serving the active configuration. Healthy: serving as planned.
-- A condition reason this script does not know is Unknown, never Healthy by mistake.
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

-- Every reason the operator writes, by condition type: its health, or true for "no verdict".
local known = {
  Ready = {
    Serving = "Healthy",
    Advisory = "Healthy",
    Paused = "Suspended",
    InvalidSpec = "Degraded",
    TargetNotAllowed = "Degraded",
    TritonUnreachable = "Degraded",
    TargetClaimed = "Degraded",
    SwitchFailed = "Degraded",
    MetricsUnavailable = "Degraded",
    MetricsCredentialsUnavailable = "Degraded",
  },
  Paused = {
    Active = true,
    PausedBySpec = "Suspended",
    PausedByAnnotation = "Suspended",
    InvalidPauseAnnotation = "Degraded",
  },
  Degraded = {
    AsPlanned = true,
    TritonUnreachable = "Degraded",
    TargetClaimed = "Degraded",
    SwitchFailed = "Degraded",
    MetricsUnavailable = "Degraded",
    MetricsCredentialsUnavailable = "Degraded",
  },
  MetricsAvailable = {
    MetricsRead = true,
    MetricsUnavailable = true,
    MetricsCredentialsUnavailable = true,
  },
  PodsServing = { AllPodsServing = true, PodsLagging = "Progressing" },
}

local ready = condition("Ready")
local observed = obj.status ~= nil and obj.status.observedGeneration or nil
if ready == nil or (observed ~= nil and obj.metadata.generation ~= nil
    and observed < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator's first decision on this generation"
  return hs
end

-- The worst verdict wins: Degraded over Suspended over Progressing over Healthy; between
-- equals, the first condition in this order gives the message (Ready, the summary, last).
local rank = { Healthy = 0, Progressing = 1, Suspended = 2, Degraded = 3 }
local status = "Healthy"
local message = ready.message or ""
for _, kind in ipairs({ "Degraded", "Paused", "PodsServing", "Ready", "MetricsAvailable" }) do
  local reasons = known[kind]
  local c = condition(kind)
  if c ~= nil then
    local verdict = reasons[c.reason]
    if verdict == nil then
      hs.status = "Unknown"
      hs.message = kind .. " reason " .. tostring(c.reason)
        .. " is unknown to this health check: update it (docs/argocd/)"
      return hs
    end
    if verdict ~= true and rank[verdict] > rank[status] then
      status = verdict
      message = c.message or ""
    end
  end
end
hs.status = status
hs.message = message
return hs
